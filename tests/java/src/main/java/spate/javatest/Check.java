package spate.javatest;

import java.time.Duration;
import java.util.function.Supplier;

/** Assertions and deadline waits for the Java client checks (no test framework: each
 * scenario is a main program; a failed check ends it with exit code 1 and the message). */
final class Check {
    private Check() {}

    static void that(boolean cond, String what) {
        if (!cond) {
            throw new AssertionError(what);
        }
    }

    static void equal(Object expected, Object actual, String what) {
        if (isIntegral(expected) && isIntegral(actual)) {
            // 3 and 3L are the same count.
            if (((Number) expected).longValue() != ((Number) actual).longValue()) {
                throw new AssertionError(what + ": expected " + expected + ", got " + actual);
            }
            return;
        }
        if (expected == null ? actual != null : !expected.equals(actual)) {
            throw new AssertionError(what + ": expected " + expected + ", got " + actual);
        }
    }

    private static boolean isIntegral(Object o) {
        return o instanceof Integer || o instanceof Long || o instanceof Short;
    }

    /** Polls `cond` every 50 ms until it holds; fails with `seen.get()` after `timeout`. */
    static void waitUntil(Duration timeout, String what, Supplier<Boolean> cond, Supplier<Object> seen)
            throws InterruptedException {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (!cond.get()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("timed out after " + timeout.toSeconds() + "s waiting for " + what
                        + "; seen: " + seen.get());
            }
            Thread.sleep(50); // polling interval of a deadline wait, not synchronization
        }
    }

    interface Attempt {
        void run() throws Exception;
    }

    /** Runs `attempt` until it passes (no exception, no failed check), every 100 ms until
     * `timeout`, then fails with its last failure: for what each broker of a cluster
     * learns a moment after the coordinator answered (a new topic, a deleted one). */
    static void eventually(Duration timeout, String what, Attempt attempt) throws InterruptedException {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (true) {
            try {
                attempt.run();
                return;
            } catch (Exception | AssertionError e) {
                if (System.nanoTime() > deadline) {
                    throw new AssertionError("timed out after " + timeout.toSeconds() + "s: " + what + ": " + e, e);
                }
            }
            Thread.sleep(100); // retry interval of a deadline wait, not synchronization
        }
    }

    interface Body {
        void run() throws Exception;
    }

    /** Runs a scenario and exits: 0 after it passes, 1 with its stack trace when a check
     * fails or anything throws, at once, whatever threads (a group member's) still run. */
    static void main(Body body) {
        int code = 1;
        try {
            body.run();
            code = 0;
        } catch (Throwable t) {
            t.printStackTrace(System.out);
        } finally {
            System.out.flush();
            System.exit(code);
        }
    }

    static void log(String msg) {
        System.out.println("[java-check] " + msg);
        System.out.flush();
    }
}

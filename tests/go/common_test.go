// Package spatego runs Go's two main Kafka clients, franz-go (kgo, kadm) and sarama,
// against a running Spate broker or cluster, with every record read back and checked.
//
// Environment (set by tests/test_go_clients.py):
//
//	SPATE_BOOTSTRAP           comma-separated host:port list (required)
//	SPATE_BROKERS             how many brokers the cluster has (default 1)
//	SPATE_REPLICATION_FACTOR  replication factor of the topics the tests create (default 1)
//	SPATE_GO_LOG              "debug" or "info": the clients' own logs on stderr
//
// Every client runs with its defaults (franz-go: idempotent, acks=all; sarama: its
// default protocol version, acks=1), except where a test must say what it reads
// (sarama's consumer group starts from the oldest offset instead of the newest).
package spatego

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// testTimeout bounds one test's whole run; pytest's own timeout is above it.
const testTimeout = 150 * time.Second

type env struct {
	bootstrap         []string
	brokers           int
	replicationFactor int16
	logLevel          string
}

func loadEnv(t *testing.T) env {
	t.Helper()
	bs := os.Getenv("SPATE_BOOTSTRAP")
	if bs == "" {
		t.Fatal("SPATE_BOOTSTRAP is not set (a comma-separated host:port list)")
	}
	e := env{bootstrap: strings.Split(bs, ","), brokers: 1, replicationFactor: 1,
		logLevel: os.Getenv("SPATE_GO_LOG")}
	if v := os.Getenv("SPATE_BROKERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("SPATE_BROKERS=%q: %v", v, err)
		}
		e.brokers = n
	}
	if v := os.Getenv("SPATE_REPLICATION_FACTOR"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("SPATE_REPLICATION_FACTOR=%q: %v", v, err)
		}
		e.replicationFactor = int16(n)
	}
	return e
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// uniqueName gives each run its own topics and groups.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1_000_000_000, rand.Intn(1_000_000))
}

// waitFor polls cond every 100 ms until it returns nil or the deadline passes, then
// fails with the last error cond returned.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if last = cond(); last == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v: %v", what, timeout, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// produced is what the broker acknowledged for one record.
type produced struct {
	seq       int
	key       string
	value     string
	partition int32
	offset    int64
}

// checkAcks checks that the acknowledged offsets of each partition are exactly
// 0..n-1 with the records in the order they were sent (seq increasing with offset), and
// that records with the same key went to the same partition. It returns the record at
// each (partition, offset) and the end offset of each partition.
func checkAcks(t *testing.T, acks []produced, partitions int32) (map[int32]map[int64]produced, map[int32]int64) {
	t.Helper()
	byPart := make(map[int32]map[int64]produced)
	keyPart := make(map[string]int32)
	for _, a := range acks {
		if a.partition < 0 || a.partition >= partitions {
			t.Fatalf("record %d acknowledged on partition %d of a %d-partition topic", a.seq, a.partition, partitions)
		}
		if p, ok := keyPart[a.key]; ok && p != a.partition {
			t.Fatalf("key %q went to partitions %d and %d", a.key, p, a.partition)
		}
		keyPart[a.key] = a.partition
		if byPart[a.partition] == nil {
			byPart[a.partition] = make(map[int64]produced)
		}
		if prev, dup := byPart[a.partition][a.offset]; dup {
			t.Fatalf("records %d and %d both acknowledged at partition %d offset %d", prev.seq, a.seq, a.partition, a.offset)
		}
		byPart[a.partition][a.offset] = a
	}
	ends := make(map[int32]int64)
	for p := int32(0); p < partitions; p++ {
		recs := byPart[p]
		n := int64(len(recs))
		lastSeq := -1
		for o := int64(0); o < n; o++ {
			r, ok := recs[o]
			if !ok {
				t.Fatalf("partition %d: %d records acknowledged but none at offset %d (offsets must be 0..%d)", p, n, o, n-1)
			}
			if r.seq <= lastSeq {
				t.Fatalf("partition %d: record %d at offset %d after record %d: out of send order", p, r.seq, o, lastSeq)
			}
			lastSeq = r.seq
		}
		ends[p] = n
	}
	return byPart, ends
}

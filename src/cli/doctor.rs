//! `spate doctor`: checks the host against tuning.md and says what to change. Reads
//! /proc and /sys only (plus one io_uring_setup probe); changes nothing. Every check
//! that cannot be read is reported as "unknown", never as a failure of the command.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::output;

/// memlock below this makes io_uring rings and registered buffers fail on kernels
/// before 5.12 (which charge rings to RLIMIT_MEMLOCK); glommio wants more per shard.
const memlock_bytes_min: u64 = 64 * 1024 * 1024;
/// Open files a broker with many partitions needs (segments + indexes + sockets).
const open_files_min: u64 = 100_000;

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// The broker's data directory (its file system and disk are checked).
    #[arg(long, default_value = "./data")]
    data_dir: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Verdict {
    Ok,
    Warn,
    Unknown,
}

struct Check {
    name: &'static str,
    verdict: Verdict,
    found: String,
    advice: String,
}

fn read(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

fn check(name: &'static str, verdict: Verdict, found: impl Into<String>, advice: impl Into<String>) -> Check {
    Check { name, verdict, found: found.into(), advice: advice.into() }
}

pub fn run(args: DoctorArgs) -> u8 {
    let checks = vec![
        cpu_governor(),
        io_uring(),
        memlock(),
        open_files(),
        filesystem(&args.data_dir),
        disk_scheduler(&args.data_dir),
        clocksource(),
        transparent_hugepages(),
        swappiness(),
        irq_balance(),
        free_page_reporting(),
    ];
    if args.json {
        let v: Vec<_> = checks
            .iter()
            .map(|c| {
                let verdict = match c.verdict {
                    Verdict::Ok => "ok",
                    Verdict::Warn => "warn",
                    Verdict::Unknown => "unknown",
                };
                json!({"check": c.name, "verdict": verdict, "found": c.found, "advice": c.advice})
            })
            .collect();
        output::json(&json!(v));
    } else {
        let mut out = String::new();
        for c in &checks {
            let tag = match c.verdict {
                Verdict::Ok => "ok  ",
                Verdict::Warn => "WARN",
                Verdict::Unknown => "??  ",
            };
            out.push_str(&format!("[{tag}] {:<22} {}\n", c.name, c.found));
            if c.verdict != Verdict::Ok && !c.advice.is_empty() {
                out.push_str(&format!("       {:<22} -> {}\n", "", c.advice));
            }
        }
        let warns = checks.iter().filter(|c| c.verdict == Verdict::Warn).count();
        out.push_str(&format!("\n{warns} warning(s); see tuning.md for why each setting matters\n"));
        output::print_raw(&out);
    }
    0
}

fn cpu_governor() -> Check {
    let mut governors: Vec<String> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu") {
        for e in dir.flatten() {
            if let Some(g) = read(e.path().join("cpufreq/scaling_governor")) {
                if !governors.contains(&g) {
                    governors.push(g);
                }
            }
        }
    }
    if governors.is_empty() {
        return check("cpu governor", Verdict::Unknown, "no cpufreq (VM or driver without governors)", "");
    }
    let found = governors.join(",");
    if governors.iter().all(|g| g == "performance") {
        check("cpu governor", Verdict::Ok, found, "")
    } else {
        check("cpu governor", Verdict::Warn, found, "cpupower frequency-set -g performance (every core)")
    }
}

fn io_uring() -> Check {
    // 0: enabled, 1: only for io_uring_group members, 2: disabled (Linux 6.6+).
    let disabled = read("/proc/sys/kernel/io_uring_disabled");
    if let Some(d) = &disabled {
        if d != "0" {
            return check(
                "io_uring",
                Verdict::Warn,
                format!("kernel.io_uring_disabled={d}"),
                "sysctl kernel.io_uring_disabled=0",
            );
        }
    }
    // Probe: io_uring_setup with 1 entry, then close the ring.
    let mut params = [0u8; 120]; // struct io_uring_params
                                 // SAFETY: the syscall writes at most sizeof(io_uring_params) = 120 bytes into `params`.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    if fd >= 0 {
        // SAFETY: fd is a descriptor this function just got from the kernel.
        unsafe { libc::close(fd as i32) };
        let kernel = read("/proc/sys/kernel/osrelease").unwrap_or_default();
        check("io_uring", Verdict::Ok, format!("io_uring_setup works (kernel {kernel})"), "")
    } else {
        let err = std::io::Error::last_os_error();
        check(
            "io_uring",
            Verdict::Warn,
            format!("io_uring_setup fails: {err}"),
            "a kernel >= 5.8 with io_uring enabled (seccomp profiles of container runtimes often block it)",
        )
    }
}

fn rlimit(resource: libc::__rlimit_resource_t) -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one struct rlimit.
    (unsafe { libc::getrlimit(resource, &mut lim) } == 0).then_some(lim.rlim_cur)
}

fn memlock() -> Check {
    match rlimit(libc::RLIMIT_MEMLOCK) {
        Some(v) if v == libc::RLIM_INFINITY || v >= memlock_bytes_min => {
            check("memlock ulimit", Verdict::Ok, human_limit(v), "")
        }
        Some(v) => check(
            "memlock ulimit",
            Verdict::Warn,
            human_limit(v),
            format!(
                "ulimit -l unlimited (or LimitMEMLOCK=infinity in the systemd unit); at least {} MiB",
                memlock_bytes_min >> 20
            ),
        ),
        None => check("memlock ulimit", Verdict::Unknown, "getrlimit failed", ""),
    }
}

fn open_files() -> Check {
    match rlimit(libc::RLIMIT_NOFILE) {
        // A count of files, not bytes: "unlimited" or the number.
        Some(v) if v >= open_files_min => check("open files ulimit", Verdict::Ok, count_limit(v), ""),
        Some(v) => check(
            "open files ulimit",
            Verdict::Warn,
            v.to_string(),
            format!("ulimit -n {open_files_min} (LimitNOFILE= in systemd)"),
        ),
        None => check("open files ulimit", Verdict::Unknown, "getrlimit failed", ""),
    }
}

fn count_limit(v: u64) -> String {
    if v == libc::RLIM_INFINITY {
        "unlimited".into()
    } else {
        v.to_string()
    }
}

fn human_limit(v: u64) -> String {
    if v == libc::RLIM_INFINITY {
        "unlimited".into()
    } else if v >= 1 << 20 {
        format!("{} MiB", v >> 20)
    } else {
        format!("{} KiB", v >> 10)
    }
}

/// The /proc/self/mounts entry whose mount point is the longest prefix of `dir`.
fn mount_of(dir: &Path) -> Option<(String, String, String, String)> {
    let mut dir = dir.to_path_buf();
    while !dir.exists() {
        dir = dir.parent()?.to_path_buf();
        if dir.as_os_str().is_empty() {
            dir = PathBuf::from(".");
        }
    }
    let dir = std::fs::canonicalize(&dir).ok()?;
    let mounts = read("/proc/self/mounts")?;
    let mut best: Option<(String, String, String, String)> = None;
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 {
            continue;
        }
        let mp = f[1].replace("\\040", " ");
        if dir.starts_with(&mp) && best.as_ref().is_none_or(|b| mp.len() >= b.1.len()) {
            best = Some((f[0].to_string(), mp, f[2].to_string(), f[3].to_string()));
        }
    }
    best
}

fn filesystem(data_dir: &Path) -> Check {
    let Some((dev, mp, fstype, opts)) = mount_of(data_dir) else {
        return check(
            "data dir file system",
            Verdict::Unknown,
            format!("cannot find the mount of {}", data_dir.display()),
            "",
        );
    };
    let found = format!("{fstype} on {mp} ({dev}) opts {opts}");
    let mut advice = Vec::new();
    if !matches!(fstype.as_str(), "xfs" | "ext4") {
        advice.push(format!("put the data dir on XFS or ext4 ({fstype} is untested)"));
    }
    let has = |o: &str| opts.split(',').any(|x| x == o);
    if !has("noatime") {
        advice.push("mount with noatime".to_string());
    }
    if fstype == "ext4" && opts.contains("data=journal") {
        advice.push("ext4 data=journal doubles writes; use data=ordered".into());
    }
    if advice.is_empty() {
        check("data dir file system", Verdict::Ok, found, "")
    } else {
        check("data dir file system", Verdict::Warn, found, advice.join("; "))
    }
}

fn disk_scheduler(data_dir: &Path) -> Check {
    let Some((dev, ..)) = mount_of(data_dir) else {
        return check("disk scheduler", Verdict::Unknown, "no mount found", "");
    };
    let Some(name) = dev.strip_prefix("/dev/") else {
        return check("disk scheduler", Verdict::Unknown, format!("{dev} is not a block device"), "");
    };
    // A partition's queue is its parent disk's: /sys/class/block/<part>/../queue.
    let class = Path::new("/sys/class/block").join(name);
    let queue = [class.join("queue/scheduler"), class.join("../queue/scheduler")]
        .into_iter()
        .find_map(|p| std::fs::canonicalize(&p).ok().or(Some(p)).and_then(read));
    let Some(sched) = queue else {
        return check("disk scheduler", Verdict::Unknown, format!("no queue/scheduler for {name}"), "");
    };
    let active =
        sched.split_whitespace().find(|s| s.starts_with('[')).unwrap_or(&sched).trim_matches(|c| c == '[' || c == ']');
    let rotational = read(class.join("queue/rotational")).or_else(|| read(class.join("../queue/rotational")));
    let found = format!("{name}: {active} (rotational={})", rotational.as_deref().unwrap_or("?"));
    if active == "none" || active == "mq-deadline" || active == "noop" {
        check("disk scheduler", Verdict::Ok, found, "")
    } else {
        check(
            "disk scheduler",
            Verdict::Warn,
            found,
            format!("echo none > /sys/block/{name}/queue/scheduler (NVMe), mq-deadline for SATA"),
        )
    }
}

fn clocksource() -> Check {
    match read("/sys/devices/system/clocksource/clocksource0/current_clocksource") {
        Some(c) if c == "tsc" || c == "arch_sys_counter" => check("clocksource", Verdict::Ok, c, ""),
        Some(c) => check(
            "clocksource",
            Verdict::Warn,
            c.clone(),
            "use tsc (clocksource=tsc tsc=reliable on the kernel command line); slow clocks tax every timestamp",
        ),
        None => check("clocksource", Verdict::Unknown, "unreadable", ""),
    }
}

fn transparent_hugepages() -> Check {
    match read("/sys/kernel/mm/transparent_hugepage/enabled") {
        Some(t) => {
            let active = t.split_whitespace().find(|s| s.starts_with('[')).unwrap_or(&t).to_string();
            if active == "[always]" {
                check(
                    "transparent hugepages",
                    Verdict::Warn,
                    active,
                    "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled (latency spikes from compaction)",
                )
            } else {
                check("transparent hugepages", Verdict::Ok, active, "")
            }
        }
        None => check("transparent hugepages", Verdict::Unknown, "unreadable", ""),
    }
}

fn swappiness() -> Check {
    match read("/proc/sys/vm/swappiness").and_then(|s| s.parse::<u32>().ok()) {
        Some(v) if v <= 10 => check("vm.swappiness", Verdict::Ok, v.to_string(), ""),
        Some(v) => check(
            "vm.swappiness",
            Verdict::Warn,
            v.to_string(),
            "sysctl vm.swappiness=1 (keep the page cache, do not swap the broker)",
        ),
        None => check("vm.swappiness", Verdict::Unknown, "unreadable", ""),
    }
}

fn irq_balance() -> Check {
    let running = std::fs::read_dir("/proc")
        .ok()
        .is_some_and(|dir| dir.flatten().any(|e| read(e.path().join("comm")).is_some_and(|c| c == "irqbalance")));
    if running {
        check(
            "irq affinity",
            Verdict::Warn,
            "irqbalance is running",
            "pin NIC and NVMe interrupts away from the broker's cores (or run `spate serve --cores` on the others)",
        )
    } else {
        check("irq affinity", Verdict::Ok, "irqbalance not running", "")
    }
}

/// virtio device id of a memory balloon.
const virtio_balloon_device: &str = "0x0005";
/// VIRTIO_BALLOON_F_REPORTING: the guest reports its free pages to the host.
const virtio_balloon_free_page_reporting_bit: usize = 5;

/// Whether any of these virtio devices (their `device` and `features` files, as in
/// /sys/bus/virtio/devices/*: features one '0'/'1' character per bit, bit 0 first) is a
/// balloon that reports free pages.
fn reports_free_pages(devices: &[(String, String)]) -> bool {
    devices.iter().any(|(device, features)| {
        device == virtio_balloon_device
            && features.as_bytes().get(virtio_balloon_free_page_reporting_bit) == Some(&b'1')
    })
}

fn free_page_reporting() -> Check {
    let devices: Vec<(String, String)> = std::fs::read_dir("/sys/bus/virtio/devices")
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| Some((read(e.path().join("device"))?, read(e.path().join("features"))?)))
                .collect()
        })
        .unwrap_or_default();
    if reports_free_pages(&devices) {
        check(
            "free page reporting",
            Verdict::Warn,
            "a virtio balloon hands free memory back to the host",
            "spate serve --drop-behind-bytes 1073741824 (page-cache growth into free memory faults on the host; tuning.md)",
        )
    } else {
        check("free page reporting", Verdict::Ok, "no virtio balloon reporting free pages", "")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_page_reporting_is_bit_5_of_a_balloon_only() {
        let dev = |d: &str, f: &str| (d.to_string(), f.to_string());
        // This development VM's balloon: stats queue, deflate on OOM, free page reporting.
        assert!(reports_free_pages(&[dev("0x0002", "0010001"), dev("0x0005", "0110010100000000")]));
        assert!(!reports_free_pages(&[dev("0x0005", "0110000100000000")]), "a balloon without bit 5");
        assert!(!reports_free_pages(&[dev("0x0001", "0000010000000000")]), "bit 5 of a network device");
        assert!(!reports_free_pages(&[dev("0x0005", "0110")]), "features too short to say");
        assert!(!reports_free_pages(&[]));
    }

    #[test]
    fn limits_are_shown_in_their_own_units() {
        // Open files are a count (this once read "97 KiB" for 100000 files).
        assert_eq!(count_limit(open_files_min), "100000");
        assert_eq!(count_limit(libc::RLIM_INFINITY), "unlimited");
        // memlock is bytes.
        assert_eq!(human_limit(memlock_bytes_min), "64 MiB");
        assert_eq!(human_limit(512 << 10), "512 KiB");
    }
}

//! The process's own metrics, with the names every Prometheus client library uses
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, ...), read from `/proc` at
//! scrape time, and `meridian_build_info`. Every admin port serves them: a gateway's open
//! descriptors against its limit are its saturation signal.
//!
//! Off Linux (no `/proc/self`) the process metrics are left out rather than reported as 0.

use std::sync::OnceLock;

use crate::Registry;

/// The version and commit `meridian_build_info` reports.
static BUILD: OnceLock<(&'static str, &'static str)> = OnceLock::new();

/// Sets what `meridian_build_info{version, commit}` says: the binary's crate version and
/// its git commit (`unknown` where it was built without one). First call wins; without
/// one, this crate's version and `unknown`.
pub fn set_build_info(version: &'static str, commit: &'static str) {
    let _ = BUILD.set((version, commit));
}

/// What `/proc/self/stat` says, in the units the metrics want.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    /// User plus system CPU time.
    pub cpu_seconds: f64,
    /// When the process started, in seconds since the Unix epoch.
    pub start_time_seconds: f64,
    pub virtual_memory_bytes: u64,
    pub resident_memory_bytes: u64,
}

impl Stat {
    /// Reads `/proc/self/stat` (and the boot time from `/proc/stat`).
    pub fn read() -> Option<Stat> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        Stat::parse(&stat, &boot, clock_ticks_per_second(), page_size())
    }

    /// Parses `stat` (`/proc/self/stat`) with the boot time from `system` (`/proc/stat`).
    /// The command name (field 2) may hold spaces and parentheses, so fields are counted
    /// from its last `)`.
    pub fn parse(stat: &str, system: &str, ticks: u64, page: u64) -> Option<Stat> {
        let after_name = &stat[stat.rfind(')')? + 1..];
        // Field 3 (state) is the first after the name; proc(5) numbers fields from 1.
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        let (utime, stime, start) = (field(14)?, field(15)?, field(22)?);
        let (vsize, rss_pages) = (field(23)?, field(24)?);
        let boot: u64 = system
            .lines()
            .find_map(|line| line.strip_prefix("btime "))
            .and_then(|value| value.trim().parse().ok())?;
        let ticks = ticks.max(1) as f64;
        Some(Stat {
            cpu_seconds: (utime + stime) as f64 / ticks,
            start_time_seconds: boot as f64 + start as f64 / ticks,
            virtual_memory_bytes: vsize,
            resident_memory_bytes: rss_pages.saturating_mul(page),
        })
    }
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf reads a constant of the running system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100)
}

fn page_size() -> u64 {
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// Open file descriptors: the entries of `/proc/self/fd` (the one reading the directory
/// is counted out).
pub fn open_fds() -> Option<u64> {
    let entries = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    Some(entries.saturating_sub(1))
}

/// The soft limit on open file descriptors, from `/proc/self/limits` (`unlimited`: none).
pub fn max_fds() -> Option<u64> {
    parse_max_fds(&std::fs::read_to_string("/proc/self/limits").ok()?)
}

/// The soft "Max open files" of a `/proc/<pid>/limits` text.
pub fn parse_max_fds(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|line| line.starts_with("Max open files"))?;
    let soft = line.trim_start_matches("Max open files").split_whitespace().next()?;
    match soft {
        "unlimited" => Some(u64::MAX),
        number => number.parse().ok(),
    }
}

/// Registers the process metrics and `meridian_build_info` in `registry` (once per
/// registry: the admin port does it when it starts serving).
pub fn register(registry: &Registry) {
    let (version, commit) = BUILD.get().copied().unwrap_or((env!("CARGO_PKG_VERSION"), "unknown"));
    registry
        .gauge(
            "meridian_build_info",
            "The binary's version and git commit (value 1).",
            &[("version", version), ("commit", commit)],
        )
        .set(1);
    if Stat::read().is_none() {
        return;
    }
    let stat = |read: fn(&Stat) -> f64| move || Stat::read().map_or(f64::NAN, |s| read(&s));
    registry.float_fn(
        "process_cpu_seconds_total",
        "Total user and system CPU time spent in seconds.",
        crate::metrics::Kind::Counter,
        stat(|s| s.cpu_seconds),
    );
    registry.float_fn(
        "process_resident_memory_bytes",
        "Resident memory size in bytes.",
        crate::metrics::Kind::Gauge,
        stat(|s| s.resident_memory_bytes as f64),
    );
    registry.float_fn(
        "process_virtual_memory_bytes",
        "Virtual memory size in bytes.",
        crate::metrics::Kind::Gauge,
        stat(|s| s.virtual_memory_bytes as f64),
    );
    registry.float_fn(
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
        crate::metrics::Kind::Gauge,
        stat(|s| s.start_time_seconds),
    );
    registry.float_fn(
        "process_open_fds",
        "Number of open file descriptors.",
        crate::metrics::Kind::Gauge,
        || open_fds().map_or(f64::NAN, |n| n as f64),
    );
    registry.float_fn(
        "process_max_fds",
        "Maximum number of open file descriptors.",
        crate::metrics::Kind::Gauge,
        || max_fds().map_or(f64::NAN, |n| n as f64),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_stat_line_whose_name_has_spaces_and_parentheses() {
        // From proc(5): pid (comm) state ppid ... utime(14) stime(15) ... starttime(22)
        // vsize(23) rss(24) ...
        let mut fields: Vec<String> = (3..=52).map(|n| format!("{n}")).collect();
        fields[0] = "S".into();
        fields[14 - 3] = "250".into();
        fields[15 - 3] = "50".into();
        fields[22 - 3] = "1000".into();
        fields[23 - 3] = "123456789".into();
        fields[24 - 3] = "10".into();
        let stat = format!("4242 (a (weird) name) {}", fields.join(" "));
        let system = "cpu  1 2 3\nbtime 1700000000\nprocesses 9\n";
        let parsed = Stat::parse(&stat, system, 100, 4096).expect("parses");
        assert_eq!(parsed.cpu_seconds, 3.0);
        assert_eq!(parsed.start_time_seconds, 1_700_000_010.0);
        assert_eq!(parsed.virtual_memory_bytes, 123_456_789);
        assert_eq!(parsed.resident_memory_bytes, 40_960);
        assert_eq!(Stat::parse("4242 (cut", system, 100, 4096), None);
    }

    #[test]
    fn parses_the_open_files_limit() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max cpu time              unlimited            unlimited            seconds\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_max_fds(limits), Some(1024));
        let unlimited = limits.replace("1024     ", "unlimited");
        assert_eq!(parse_max_fds(&unlimited), Some(u64::MAX));
        assert_eq!(parse_max_fds("nothing"), None);
    }

    /// This test's own process, read as a scrape would: CPU spent, memory resident, some
    /// descriptors open and fewer than the limit, a start time in the past.
    #[test]
    fn reads_this_process() {
        let busy: u64 = (0..2_000_000u64).fold(0, |acc, n| acc.wrapping_add(n * n));
        assert!(busy > 0);
        let stat = Stat::read().expect("/proc/self/stat");
        assert!(stat.cpu_seconds > 0.0, "{stat:?}");
        assert!(stat.resident_memory_bytes > 1 << 20, "{stat:?}");
        assert!(stat.virtual_memory_bytes >= stat.resident_memory_bytes, "{stat:?}");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        assert!(
            stat.start_time_seconds > 1e9 && stat.start_time_seconds <= now.as_secs_f64() + 1.0
        );
        let (open, max) = (open_fds().expect("fds"), max_fds().expect("limit"));
        assert!(open >= 3 && open <= max, "{open} of {max}");
    }
}

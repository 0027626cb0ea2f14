//! Where the machine's CPU time goes between two readings: each command's (`/proc/PID/comm`,
//! summed over its processes) beside the whole machine's busy and idle time (`/proc/stat`).
//! On the lab's two cores the API server, etcd, the kubelets, Rigger and the bench share
//! one machine, so a latency measured there is read beside this.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use anyhow::Context as _;

/// USER_HZ on Linux: the unit of `/proc`'s CPU times.
const TICKS_PER_SECOND: u64 = 100;

/// The CPU time used so far, by command and for the whole machine.
#[derive(Debug, Clone)]
pub struct CpuReading {
    at: Instant,
    by_command: BTreeMap<String, u64>,
    busy: u64,
    idle: u64,
}

/// Reads every process's CPU time and the machine's.
pub fn read() -> anyhow::Result<CpuReading> {
    let at = Instant::now();
    let machine = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let (busy, idle) = machine_ticks(&machine).context("no `cpu` line in /proc/stat")?;
    let mut by_command: BTreeMap<String, u64> = BTreeMap::new();
    for entry in std::fs::read_dir("/proc")
        .context("reading /proc")?
        .flatten()
    {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        // A process may end between the listing and the read: it is left out.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some((command, ticks)) = process_ticks(&stat) {
            *by_command.entry(command.to_owned()).or_default() += ticks;
        }
    }
    Ok(CpuReading {
        at,
        by_command,
        busy,
        idle,
    })
}

/// The machine's busy and idle ticks from `/proc/stat`'s first line (pure): idle is
/// `idle` + `iowait`; busy is every other field but `guest` and `guest_nice`, which
/// `user` and `nice` already hold.
fn machine_ticks(proc_stat: &str) -> Option<(u64, u64)> {
    let line = proc_stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let field = |i: usize| fields.get(i).copied().unwrap_or(0);
    let idle = field(3) + field(4);
    let busy = field(0) + field(1) + field(2) + field(5) + field(6) + field(7);
    Some((busy, idle))
}

/// A process's command and its user plus system ticks from its `/proc/PID/stat` (pure):
/// the command is between the first `(` and the last `)`, since it may hold either.
pub fn process_ticks(stat: &str) -> Option<(&str, u64)> {
    let (_, rest) = stat.split_once('(')?;
    let (command, after) = rest.rsplit_once(')')?;
    let mut fields = after.split_whitespace();
    // After the command: state is field 3, utime 14 and stime 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((command, utime + stime))
}

/// `ticks` of `/proc`'s CPU time as a duration.
pub fn cpu_time(ticks: u64) -> std::time::Duration {
    std::time::Duration::from_millis(ticks * 1000 / TICKS_PER_SECOND)
}

/// What each command used between `before` and `after`, biggest first, as a markdown
/// table with each one's share of the machine's capacity (`cores` × the time between),
/// then the machine's busy share; commands under `floor` of it are summed as "others"
/// (pure).
pub fn table(before: &CpuReading, after: &CpuReading, cores: usize, floor: f64) -> String {
    let seconds = |ticks: u64| ticks as f64 / TICKS_PER_SECOND as f64;
    let wall = after.at.duration_since(before.at).as_secs_f64();
    let capacity = (wall * cores.max(1) as f64).max(f64::MIN_POSITIVE);
    let mut used: Vec<(&str, f64)> = after
        .by_command
        .iter()
        .map(|(command, ticks)| {
            let earlier = before.by_command.get(command).copied().unwrap_or(0);
            (command.as_str(), seconds(ticks.saturating_sub(earlier)))
        })
        .filter(|(_, s)| *s > 0.0)
        .collect();
    used.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut out = format!(
        "| process (command) | CPU | of the machine's {cores} cores × {wall:.0} s |\n|---|---|---|\n"
    );
    let mut others = 0.0;
    for (command, s) in used {
        if s / capacity < floor {
            others += s;
            continue;
        }
        let _ = writeln!(
            out,
            "| {command} | {s:.0} s | {:.0} % |",
            100.0 * s / capacity
        );
    }
    if others > 0.0 {
        let _ = writeln!(
            out,
            "| others | {others:.0} s | {:.0} % |",
            100.0 * others / capacity
        );
    }
    let busy = seconds(after.busy.saturating_sub(before.busy));
    let idle = seconds(after.idle.saturating_sub(before.idle));
    let _ = writeln!(
        out,
        "| **the machine busy** (`/proc/stat`) | {busy:.0} s | **{:.0} %** (idle {:.0} %) |",
        100.0 * busy / (busy + idle).max(f64::MIN_POSITIVE),
        100.0 * idle / (busy + idle).max(f64::MIN_POSITIVE)
    );
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_process_command_may_hold_spaces_and_parentheses() {
        let stat = "4242 (rigger (x) y) S 1 4242 4242 0 -1 4194560 1 0 0 0 250 40 0 0 20 0 9 0";
        assert_eq!(process_ticks(stat), Some(("rigger (x) y", 290)));
        assert_eq!(process_ticks("4242 (short) S 1"), None);
        assert_eq!(process_ticks("no parentheses"), None);
    }

    #[test]
    fn the_machine_counts_iowait_as_idle_and_guests_once() {
        let proc_stat = "cpu  100 5 50 800 20 3 2 1 40 0\ncpu0 50 2 25 400 10 1 1 0 20 0\n";
        assert_eq!(machine_ticks(proc_stat), Some((161, 820)));
        assert_eq!(machine_ticks("intr 1 2 3\n"), None);
    }

    #[test]
    fn the_table_is_each_command_s_share_of_the_cores_with_small_ones_summed() {
        let at = Instant::now();
        let reading = |at, pairs: &[(&str, u64)], busy, idle| CpuReading {
            at,
            by_command: pairs.iter().map(|(c, t)| ((*c).to_owned(), *t)).collect(),
            busy,
            idle,
        };
        let before = reading(at, &[("kube-apiserver", 1_000), ("etcd", 500)], 0, 0);
        let after = reading(
            at + Duration::from_secs(100),
            &[
                ("kube-apiserver", 11_000),
                ("etcd", 3_500),
                ("sshd", 10),
                ("new", 4_000),
            ],
            18_000,
            2_000,
        );
        let table = table(&before, &after, 2, 0.01);
        let rows: Vec<&str> = table.lines().skip(2).collect();
        assert_eq!(
            rows,
            [
                "| kube-apiserver | 100 s | 50 % |",
                "| new | 40 s | 20 % |",
                "| etcd | 30 s | 15 % |",
                "| others | 0 s | 0 % |",
                "| **the machine busy** (`/proc/stat`) | 180 s | **90 %** (idle 10 %) |",
            ],
            "{table}"
        );
    }
}

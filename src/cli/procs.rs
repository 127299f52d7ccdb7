//! The processes of this machine as `/proc` shows them: who is whose parent, which
//! run gpuguard with CUDA, and whether one is still there. Shared by `run` (which
//! passes signals on) and `trim` (which picks its target and waits on it).

use std::collections::HashMap;

/// The processes under `root` (not `root` itself) with gpuguard loaded that use
/// CUDA (`libcuda.so` mapped), read from `/proc`.
pub fn cuda_processes_under(root: u32) -> Vec<u32> {
    let parents = parents();
    let mut under: Vec<u32> = vec![root];
    let mut i = 0;
    while i < under.len() {
        let p = under[i];
        under.extend(parents.iter().filter(|(_, pp)| **pp == p).map(|(c, _)| *c));
        i += 1;
    }
    under.remove(0);
    under.retain(|p| {
        std::fs::read_to_string(format!("/proc/{p}/maps")).is_ok_and(|m| {
            m.lines().any(|l| l.contains("libgpuguard"))
                && m.lines().any(|l| l.contains("libcuda.so"))
        })
    });
    under.sort_unstable();
    under
}

/// Parent of every process, read from `/proc/*/stat`.
pub fn parents() -> HashMap<u32, u32> {
    let mut map = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`: comm may hold spaces and parentheses.
        let Some(after) = stat.rfind(')').map(|at| &stat[at + 1..]) else {
            continue;
        };
        if let Some(ppid) = after.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
            map.insert(pid, ppid);
        }
    }
    map
}

/// A process's state letter and start time (clock ticks since boot), from
/// `/proc/PID/stat`; `None` when there is no such process.
fn state_and_start(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ...`: comm may hold spaces and parentheses.
    let mut after = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = after.next()?.chars().next()?;
    // Field 22, the start time, is the 20th after the name.
    let start = after.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// Whether the process that had `pid` and started at `start` still runs: not gone,
/// not a zombie waiting for its parent (which kill(pid, 0) would still find), and
/// not replaced by another process of the same pid.
pub fn still_running(pid: u32, start: u64) -> bool {
    state_and_start(pid).is_some_and(|(state, s)| s == start && !matches!(state, 'Z' | 'X'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_runs_and_an_ended_one_does_not() {
        let me = std::process::id();
        let start = state_and_start(me).unwrap().1;
        assert!(still_running(me, start));
        assert!(
            !still_running(me, start + 1),
            "another process of the same pid"
        );
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let child_start = state_and_start(pid).map(|(_, s)| s);
        // Ended but not reaped: a zombie.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while state_and_start(pid).is_some_and(|(s, _)| s != 'Z') {
            assert!(std::time::Instant::now() < deadline, "`true` never ended");
            std::thread::yield_now();
        }
        if let Some(start) = child_start {
            assert!(!still_running(pid, start));
        }
        child.wait().unwrap();
        assert!(child_start.is_none_or(|s| !still_running(pid, s)));
    }
}

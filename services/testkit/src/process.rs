//! Process liveness and signals, by pid (never by name).

/// Whether `pid` is a running process: false once it has exited, even while it is a zombie
/// waiting for its parent to reap it (a SIGKILLed shard stays a zombie until `up` reaps it).
pub fn process_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses and may hold spaces.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, None | Some('Z') | Some('X'))
}

/// Sends `signal` to `pid`; an already gone process is not an error.
pub(crate) fn signal(pid: i32, signal: libc::c_int) -> std::io::Result<()> {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    let rc = unsafe { libc::kill(pid, signal) };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ESRCH) {
        Ok(())
    } else {
        Err(err)
    }
}

/// Sends `signal` to every process of the group `pgid`.
pub(crate) fn signal_group(pgid: i32, sig: libc::c_int) -> std::io::Result<()> {
    if pgid <= 1 {
        // Never signal "every process we may" (-1) or our own group (0) by mistake.
        return Ok(());
    }
    signal(-pgid, sig)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn we_are_alive_and_a_reaped_child_is_not() {
        assert!(process_alive(std::process::id() as i32));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        assert!(!process_alive(pid));
    }

    #[test]
    fn a_zombie_is_not_alive() {
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        // Not reaped yet: it becomes a zombie once it exits.
        crate::wait_until(crate::deadline(crate::DEFAULT_WAIT), "`true` to exit", || {
            !process_alive(pid)
        })
        .unwrap();
        drop(child);
    }
}

//! Whether a process still runs: the engine's published state and the tuning's record of its
//! last pass both name the process that wrote them, and are stale once it is gone.

/// Whether process `pid` exists.
pub fn alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // Signal 0 checks existence; EPERM means it exists but belongs to someone else.
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(e) => e == nix::errno::Errno::EPERM,
    }
}

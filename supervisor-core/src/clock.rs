//! Time without internet: the clock never starts before the image's build time or the last
//! time the box knew, and `status` says whether network time has synchronised it.
//!
//! A clinic LAN may have no NTP server the box can reach, and the Pi 5's RTC keeps time only
//! with a battery on J5. Certificates and logs need a plausible clock, so the early-boot pass
//! (`supervisor provision apply`) raises the clock to the floor, and the daemon records the
//! time once an hour on the data partition (the root is read-only and `/var/lib/systemd` is in
//! RAM, so systemd-timesyncd's own record does not survive a reboot).

use serde::Serialize;

use crate::board::{Board, paths};

/// Seconds between records of the time on the data partition (kind to SD cards).
pub const SAVE_INTERVAL_S: u64 = 3600;

/// The clock as `status` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct ClockStatus {
    /// The board's time, Unix seconds.
    pub now_unix: u64,
    /// Whether systemd-timesyncd has synchronised the clock with an NTP server in this boot.
    pub synchronized: bool,
    /// The real-time clock's time when there is one (Unix seconds).
    pub rtc_unix: Option<u64>,
    /// The earliest time the clock may show: the image's build or the last time recorded.
    pub floor_unix: Option<u64>,
}

fn read_unix(board: &Board, path: &str) -> Option<u64> {
    board.read_value(path).ok()?.trim().parse().ok()
}

/// The floor: the later of the image's build time and the last recorded time.
pub fn floor_unix(board: &Board) -> Option<u64> {
    let build = read_unix(board, paths::BUILD_TIME);
    let saved = read_unix(board, paths::SAVED_CLOCK);
    build.max(saved)
}

/// The clock now, in words for `status`.
pub fn status(board: &Board) -> ClockStatus {
    ClockStatus {
        now_unix: board.now_unix(),
        synchronized: board.exists(paths::TIMESYNC_SYNCHRONIZED),
        rtc_unix: read_unix(board, &format!("{}/since_epoch", paths::RTC0)),
        floor_unix: floor_unix(board),
    }
}

/// At boot: raises a clock that is behind the floor to it, then records the time. Returns
/// what it changed, if anything.
pub fn raise_to_floor(board: &Board) -> Result<Option<String>, String> {
    let now = board.now_unix();
    let mut changed = None;
    if let Some(floor) = floor_unix(board).filter(|f| now < *f) {
        board.set_clock(floor).map_err(|e| e.to_string())?;
        changed = Some(format!(
            "the clock read {}, before this box last knew ({}); set to that until network time arrives",
            civil_time(now),
            civil_time(floor)
        ));
    }
    record(board, 0)?;
    Ok(changed)
}

/// Records the time on the data partition if it moved on by at least `interval_s` since the
/// last record.
pub fn record(board: &Board, interval_s: u64) -> Result<(), String> {
    let now = board.now_unix();
    let saved = read_unix(board, paths::SAVED_CLOCK);
    if saved.is_some_and(|s| now < s.saturating_add(interval_s.max(1))) {
        return Ok(());
    }
    if let Some(dir) = paths::SAVED_CLOCK.rsplit_once('/').map(|(d, _)| d) {
        board.create_dir_all(dir).map_err(|e| e.to_string())?;
    }
    board
        .replace_file(paths::SAVED_CLOCK, format!("{now}\n").as_bytes())
        .map_err(|e| e.to_string())
}

/// `YYYY-MM-DD HH:MM UTC` of a Unix time.
pub fn civil_time(unix: u64) -> String {
    format!(
        "{} {:02}:{:02} UTC",
        civil_date(unix),
        unix / 3600 % 24,
        unix / 60 % 60
    )
}

/// `YYYY-MM-DD` (UTC) of a Unix time.
pub fn civil_date(unix: u64) -> String {
    // Howard Hinnant's days-to-civil algorithm.
    let days = (unix / 86_400) as i64 + 719_468;
    let era = days.div_euclid(146_097);
    let doe = days - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::{civil_date, civil_time};

    #[test]
    fn dates_are_utc_calendar_days() {
        assert_eq!(
            civil_time(1_746_662_400 + 3600 + 120),
            "2025-05-08 01:02 UTC"
        );
        assert_eq!(civil_date(0), "1970-01-01");
        assert_eq!(civil_date(1_746_662_400), "2025-05-08");
        assert_eq!(civil_date(951_782_400), "2000-02-29");
    }
}

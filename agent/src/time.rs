//! RFC 3339 timestamps without a clock crate (shared by the agent and the controller).

use std::time::{SystemTime, UNIX_EPOCH};

/// The current time as RFC 3339 UTC (`2026-12-02T19:38:34Z`).
pub fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339(secs)
}

/// The current time as RFC 3339 UTC with milliseconds (`2026-12-02T19:38:34.123Z`), for log
/// lines: the latency of a change is tens of milliseconds, so seconds cannot order its steps.
pub fn now_rfc3339_millis() -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let secs = rfc3339(millis / 1000);
    format!("{}.{:03}Z", secs.trim_end_matches('Z'), millis % 1000)
}

/// Seconds since the epoch as RFC 3339 UTC.
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_240_314), "2026-12-02T19:38:34Z");
    }

    #[test]
    fn log_timestamps_carry_milliseconds() {
        let t = now_rfc3339_millis();
        // 2026-12-02T19:38:34.123Z
        assert_eq!(t.len(), 24, "{t}");
        assert_eq!(&t[19..20], ".", "{t}");
        assert!(t[20..23].bytes().all(|b| b.is_ascii_digit()), "{t}");
        assert!(t.ends_with('Z'), "{t}");
    }
}

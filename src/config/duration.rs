//! Go-style duration strings (`500ms`, `2s`, `1m30s`), as used in HAProxyTemplateConfig.

use std::time::Duration;

/// Parses `[0-9]+(.[0-9]+)?(ns|us|µs|ms|s|m|h)` repeated, e.g. `1h2m3.5s`. Unlike upstream, an
/// unparsable value is an error, never a silent fallback to the default.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".into());
    }
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("duration {text:?} lacks a unit (ms, s, m, h)"))?;
        if number_len == 0 {
            return Err(format!("duration {text:?}: expected a number at {rest:?}"));
        }
        let number: f64 = rest[..number_len]
            .parse()
            .map_err(|_| format!("duration {text:?}: bad number {:?}", &rest[..number_len]))?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds_per_unit = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            unit => {
                return Err(format!(
                    "duration {text:?}: unknown unit {unit:?} (use ms, s, m or h)"
                ))
            }
        };
        total += number * seconds_per_unit;
        rest = &rest[unit_len..];
    }
    Ok(Duration::from_secs_f64(total))
}

/// Formats a duration the way users write them (`15s`, `100ms`, `1m30s`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    if ms % 1000 != 0 {
        return format!("{ms}ms");
    }
    let secs = ms / 1000;
    match (secs / 3600, (secs % 3600) / 60, secs % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, 0) => format!("{h}h"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
    }

    #[test]
    fn rejects_bad_durations_with_reason() {
        assert!(parse_duration("15").unwrap_err().contains("unit"));
        assert!(parse_duration("2 days")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("s")
            .unwrap_err()
            .contains("expected a number"));
    }

    #[test]
    fn formats_round_trip() {
        for text in ["15s", "100ms", "1m30s", "2h", "1m"] {
            assert_eq!(format_duration(parse_duration(text).unwrap()), text);
        }
    }
}

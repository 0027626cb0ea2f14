//! Times as Rigger's objects and messages write them: RFC 3339 in UTC to the second
//! (Kubernetes' `metav1.Time`), and protobuf `Timestamp`s on the wire.

use std::time::{Duration, SystemTime};

use prost_types::Timestamp;

/// `time` as RFC 3339, to the second.
pub fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

/// Now, as RFC 3339.
pub fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
}

/// Nanoseconds since the epoch (CRI's timestamps) as RFC 3339; `None` for "never" (zero
/// or negative).
pub fn rfc3339_from_nanos(nanos: i64) -> Option<String> {
    let nanos = u64::try_from(nanos).ok().filter(|n| *n > 0)?;
    Some(rfc3339(
        SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos),
    ))
}

/// A protobuf timestamp as RFC 3339; `None` when absent, "never" or out of range.
pub fn rfc3339_from_timestamp(ts: Option<&Timestamp>) -> Option<String> {
    let ts = ts?;
    let nanos = ts
        .seconds
        .checked_mul(1_000_000_000)?
        .checked_add(i64::from(ts.nanos))?;
    rfc3339_from_nanos(nanos)
}

/// RFC 3339 text as a protobuf timestamp; `None` when absent or unreadable.
pub fn timestamp_from_rfc3339(text: Option<&str>) -> Option<Timestamp> {
    let time: SystemTime = humantime::parse_rfc3339(text?).ok()?;
    Some(time.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_is_none_and_times_round_trip() {
        assert_eq!(rfc3339_from_nanos(0), None);
        assert_eq!(rfc3339_from_nanos(-5), None);
        let text = rfc3339_from_nanos(1_700_000_000_000_000_000).unwrap();
        assert_eq!(text, "2023-11-14T22:13:20Z");
        let ts = timestamp_from_rfc3339(Some(&text)).unwrap();
        assert_eq!(
            rfc3339_from_timestamp(Some(&ts)).as_deref(),
            Some(text.as_str())
        );
        assert_eq!(timestamp_from_rfc3339(Some("yesterday")), None);
    }
}

//! Reading a container's output in bounded pieces, with nothing lost or repeated.
//!
//! Docker's logs API filters only by whole seconds (`since`), and the json-file driver
//! stores each entry with a nanosecond timestamp, appending in order. A [`LogCursor`] is
//! therefore "the first `skip` entries the daemon returns for `since` have been read": the
//! next read asks for `since` again, drops `skip` entries and reads on. Counting entries,
//! rather than comparing timestamps, stays exact when two entries share a timestamp or
//! when stdout and stderr entries land slightly out of timestamp order. `since` trails the
//! last entry read by a second, so an entry whose timestamp is a little older than one
//! written before it is still found; it never moves back.

use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

/// Where the next [`crate::executor::Executor::logs_since`] call starts reading a container's
/// output. [`LogCursor::default`] is the very beginning.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogCursor {
    /// Unix seconds passed to Docker as `since`.
    since_s: i64,
    /// How many of the entries Docker returns for `since_s` were read already.
    skip: u64,
}

impl LogCursor {
    /// The beginning of a container's output.
    pub const START: LogCursor = LogCursor {
        since_s: 0,
        skip: 0,
    };

    /// The `since` argument for Docker (whole unix seconds; bollard takes an `i32`).
    pub(crate) fn since_arg(self) -> i32 {
        i32::try_from(self.since_s).unwrap_or(i32::MAX)
    }
}

/// One log entry as Docker returns it with `timestamps=true`: `<RFC 3339 nano> <payload>`.
/// Returns the entry's unix second and its payload; `None` when there is no timestamp.
pub(crate) fn split_entry(frame: &[u8]) -> Option<(i64, &[u8])> {
    let space = frame.iter().position(|&b| b == b' ')?;
    let stamp = std::str::from_utf8(&frame[..space]).ok()?;
    let time = humantime::parse_rfc3339(stamp).ok()?;
    let secs = time.duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some((i64::try_from(secs).ok()?, &frame[space + 1..]))
}

/// Consumes the entries Docker returns for a cursor, in order, and collects at most
/// `max_bytes` of new output (but always at least one entry, so a long line still moves the
/// cursor: Docker splits lines at 16 KiB).
#[derive(Debug)]
pub(crate) struct LogReader {
    start: LogCursor,
    max_bytes: usize,
    /// Entries consumed (skipped or read) in this pass, per unix second. Seconds are
    /// few: entries arrive nearly in time order.
    per_second: std::collections::BTreeMap<i64, u64>,
    consumed: u64,
    last_s: Option<i64>,
    out: Vec<u8>,
}

impl LogReader {
    pub(crate) fn new(start: LogCursor, max_bytes: usize) -> Self {
        Self {
            start,
            max_bytes,
            per_second: Default::default(),
            consumed: 0,
            last_s: None,
            out: Vec::new(),
        }
    }

    /// Takes the next entry; returns false when it did not fit (the read is over and the
    /// entry was left for the next call).
    pub(crate) fn push(&mut self, second: i64, payload: &[u8]) -> bool {
        let new = self.consumed >= self.start.skip;
        if new {
            let read_some = self.consumed > self.start.skip;
            if read_some && self.out.len() + payload.len() > self.max_bytes {
                return false;
            }
            self.out.extend_from_slice(payload);
        }
        self.consumed += 1;
        *self.per_second.entry(second).or_default() += 1;
        self.last_s = Some(second);
        true
    }

    /// The output read and the cursor after it.
    pub(crate) fn finish(self) -> (Vec<u8>, LogCursor) {
        if self.consumed <= self.start.skip {
            // Nothing new (or fewer entries than before: rotated away). Keep the cursor.
            return (self.out, self.start);
        }
        let since_s = self
            .last_s
            .map_or(self.start.since_s, |s| s.saturating_sub(1))
            .max(self.start.since_s);
        let skip = self.per_second.range(since_s..).map(|(_, n)| n).sum();
        (self.out, LogCursor { since_s, skip })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake json-file log: what Docker returns for `since`.
    fn docker(log: &[(i64, &str)], since: i64) -> Vec<(i64, String)> {
        log.iter()
            .filter(|(s, _)| *s >= since)
            .map(|(s, p)| (*s, p.to_string()))
            .collect()
    }

    fn read(log: &[(i64, &str)], cursor: LogCursor, max: usize) -> (String, LogCursor) {
        let mut reader = LogReader::new(cursor, max);
        for (s, p) in docker(log, cursor.since_s) {
            if !reader.push(s, p.as_bytes()) {
                break;
            }
        }
        let (out, next) = reader.finish();
        (String::from_utf8(out).unwrap(), next)
    }

    fn read_all(log: &[(i64, &str)], mut cursor: LogCursor, max: usize) -> (String, LogCursor) {
        let mut all = String::new();
        loop {
            let (out, next) = read(log, cursor, max);
            if out.is_empty() {
                assert_eq!(next, cursor);
                return (all, cursor);
            }
            all.push_str(&out);
            assert!(next.since_s >= cursor.since_s);
            cursor = next;
        }
    }

    #[test]
    fn timestamps_are_split_off() {
        let (s, p) = split_entry(b"2026-05-07T21:09:36.123456789Z hello world\n").unwrap();
        assert_eq!(s, 1_778_188_176);
        assert_eq!(p, b"hello world\n");
        assert_eq!(
            split_entry(b"1970-01-01T00:00:01Z \n").unwrap(),
            (1, &b"\n"[..])
        );
        assert!(split_entry(b"hello world\n").is_none());
        assert!(split_entry(b"no-space").is_none());
    }

    #[test]
    fn output_is_read_once_whatever_the_budget() {
        let log = [
            (100, "a\n"),
            (100, "bb\n"),
            (101, "c\n"),
            (101, "c\n"),
            (103, "dddd\n"),
            // Out of timestamp order (stderr written a moment after stdout).
            (102, "e\n"),
            (104, "f\n"),
        ];
        let whole: String = log.iter().map(|(_, p)| *p).collect();
        for max in [0, 1, 2, 3, 5, 8, 1000] {
            assert_eq!(read_all(&log, LogCursor::START, max).0, whole, "max {max}");
        }
    }

    #[test]
    fn a_growing_log_is_read_in_pieces() {
        let mut log = vec![(10, "one\n"), (10, "two\n")];
        let (out, cursor) = read(&log, LogCursor::START, 100);
        assert_eq!(out, "one\ntwo\n");
        // Nothing new: the same cursor and nothing returned.
        assert_eq!(read(&log, cursor, 100), (String::new(), cursor));
        log.extend([(10, "three\n"), (11, "four\n"), (13, "five\n")]);
        let (out, cursor) = read(&log, cursor, 100);
        assert_eq!(out, "three\nfour\nfive\n");
        assert_eq!(cursor.since_s, 12);
        assert_eq!(cursor.skip, 1);
        log.push((13, "six\n"));
        assert_eq!(read(&log, cursor, 100).0, "six\n");
    }

    #[test]
    fn one_entry_always_fits() {
        let log = [(5, "a long line\n"), (5, "x\n")];
        let (out, cursor) = read(&log, LogCursor::START, 3);
        assert_eq!(out, "a long line\n");
        assert_eq!(read(&log, cursor, 3).0, "x\n");
    }
}

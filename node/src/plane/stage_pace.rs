//! A staging's pace: the bytes it has received against its own clock, so that a peer that
//! announces a large image and trickles (or sends nothing) loses its staging turn.

use std::time::Duration;

use gpux_protocol::plane_wire::StageData;

use super::stage::DATA_WITHIN;
use super::{FramedStream, recv};

/// A staging that failed after the plan: said to the renter in `StageDone::Failed`.
pub(super) struct Failed(pub(super) String);

impl<E: std::fmt::Display> From<E> for Failed {
    fn from(e: E) -> Self {
        Failed(e.to_string())
    }
}

/// A staging's data may take this long, plus a second per [`MIN_RATE`] bytes: a peer that
/// trickles cannot hold a staging turn for long. The same bound holds at every frame for the
/// bytes received so far ([`Pace`]), so a peer that announces a large image and then sends
/// little (or empty frames) loses its turn within this time, whatever size it announced.
pub(super) const DATA_DEADLINE: Duration = Duration::from_secs(120);
/// See [`DATA_DEADLINE`], bytes a second.
pub(super) const MIN_RATE: u64 = 1 << 20;
/// The bytes a staging has received against its own clock: at every frame they must keep up
/// with [`MIN_RATE`] after the first [`DATA_DEADLINE`].
pub(super) struct Pace {
    start: tokio::time::Instant,
    bytes: u64,
}

impl Pace {
    pub(super) fn new() -> Self {
        Pace {
            start: tokio::time::Instant::now(),
            bytes: 0,
        }
    }

    /// The next data frame, within [`DATA_WITHIN`], when the staging keeps its pace.
    pub(super) async fn recv(&mut self, framed: &mut FramedStream) -> Result<StageData, Failed> {
        let data: StageData = recv(framed, DATA_WITHIN)
            .await
            .map_err(|e| Failed(e.to_string()))?;
        self.bytes += data.0.len() as u64;
        let elapsed = self.start.elapsed();
        if !keeps_pace(self.bytes, elapsed) {
            return Err(Failed(format!(
                "the image arrives too slowly ({} bytes in {} s; at least 1 MiB/s is needed \
                 after the first {} s)",
                self.bytes,
                elapsed.as_secs(),
                DATA_DEADLINE.as_secs()
            )));
        }
        Ok(data)
    }
}

/// Whether `bytes` received in `elapsed` keep a staging's pace.
fn keeps_pace(bytes: u64, elapsed: Duration) -> bool {
    elapsed <= DATA_DEADLINE + Duration::from_secs(bytes / MIN_RATE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staging_that_sends_too_little_loses_its_turn_whatever_it_announced() {
        let s = Duration::from_secs;
        // Within the first two minutes anything goes, empty frames too.
        assert!(keeps_pace(0, s(120)));
        assert!(!keeps_pace(0, s(121)));
        // Then a second more per MiB received.
        assert!(keeps_pace(60 * MIN_RATE, s(180)));
        assert!(!keeps_pace(60 * MIN_RATE - 1, s(180)));
        // A steady 1 MiB/s always keeps it.
        assert!((1..10_000).all(|t| keeps_pace(t * MIN_RATE, s(t))));
    }
}

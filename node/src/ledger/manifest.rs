//! The ledger's manifest: what it has applied, kept beside its database.

/// What the ledger has applied, kept beside its database: the number of log entries and a
/// hash chain over them (`h_i = blake3(h_{i-1} || position || entry)`). Written after each
/// entry is flushed, so a log may be ahead of it (a crash in between), never behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Manifest {
    pub(super) count: u64,
    pub(super) chain: [u8; 32],
}

/// The manifest's file name, in the data dir.
pub const LEDGER_MANIFEST: &str = "ledger.manifest";

impl Manifest {
    pub(super) fn next(&self, position: u64, entry: &[u8]) -> Manifest {
        let mut hasher = blake3::Hasher::new();
        hasher.update(&self.chain);
        hasher.update(&position.to_be_bytes());
        hasher.update(entry);
        Manifest {
            count: self.count + 1,
            chain: *hasher.finalize().as_bytes(),
        }
    }

    pub(super) fn text(&self) -> String {
        format!(
            "count {}\nchain {}\n",
            self.count,
            gpux_protocol::hex(&self.chain)
        )
    }

    pub(super) fn parse(text: &str) -> Option<Manifest> {
        let mut count = None;
        let mut chain = None;
        for line in text.lines() {
            match line.split_once(' ') {
                Some(("count", n)) => count = n.trim().parse().ok(),
                Some(("chain", h)) => {
                    chain = gpux_protocol::unhex(h.trim())
                        .ok()
                        .and_then(|b| <[u8; 32]>::try_from(b).ok())
                }
                _ => {}
            }
        }
        Some(Manifest {
            count: count?,
            chain: chain?,
        })
    }
}

//! Entry points for the fuzz targets in `protocol/fuzz` (feature `fuzzing` only).
//!
//! Random bytes almost never carry a valid signature, so a fuzzer driving only
//! [`Signed::verify`] would test the framing and stop. These entry points wrap the fuzzer's
//! bytes in a well-formed header and reach the body decoders directly, skipping nothing but
//! the signature. They must never be enabled in a node.

use crate::envelope::{HEADER_LEN, MAGIC, Message, SIGNATURE_LEN, Signed};
use crate::messages::{AnySigned, MessageKind};

/// Feeds `data` to the envelope parser of any kind, then to the body decoder and to
/// verification. Must never panic.
pub fn envelope(data: &[u8]) {
    if let Ok(any) = AnySigned::from_bytes(data.to_vec()) {
        let _ = any.decode_unverified();
        let _ = any.verify();
    }
}

/// Wraps `body` in a header of kind `T` and a zero signature, then decodes it. Returns
/// whether the body decoded and passed the structural checks. Must never panic.
pub fn body<T: Message>(body: &[u8]) -> bool {
    let mut bytes = Vec::with_capacity(HEADER_LEN + body.len() + SIGNATURE_LEN);
    bytes.extend_from_slice(&MAGIC);
    bytes.push(T::KIND.code());
    bytes.push(T::KIND.version());
    bytes.extend_from_slice(&[0x11; 32]);
    bytes.extend_from_slice(body);
    bytes.extend_from_slice(&[0; SIGNATURE_LEN]);
    // Signature checking is not what this target explores (the envelope target covers it),
    // and skipping it keeps each run at decoder speed.
    Signed::<T>::from_bytes(bytes).is_ok_and(|signed| signed.decode_body_unverified().is_ok())
}

/// Parses `data` as money text. Must never panic; whatever parses must print back to itself
/// in canonical form.
pub fn money(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(amount) = text.parse::<crate::MicroCredits>() {
        let again: crate::MicroCredits = amount
            .amount_text()
            .parse()
            .unwrap_or_else(|e| panic!("{amount:?} printed as unparsable text: {e}"));
        assert_eq!(again, amount);
    }
}

/// Decodes `data` as a `/gpux/ledger/2` frame, both as a request and as an answer: the
/// ledger's request-response codec. Must never panic; a frame that decodes must encode back
/// to exactly the bytes it came from (no second spelling of one frame).
pub fn ledger_wire(data: &[u8]) {
    use crate::ledger_wire::{self, LedgerRequest, LedgerResponse};
    if let Ok(request) = ledger_wire::decode::<LedgerRequest>(data) {
        assert_eq!(ledger_wire::encode(&request), data, "{request:?}");
    }
    if let Ok(response) = ledger_wire::decode::<LedgerResponse>(data) {
        assert_eq!(ledger_wire::encode(&response), data, "{response:?}");
    }
}

/// [`body`] for the kind with this name (`Offer`, `LeaseRequest`, ...), as fuzz targets and
/// the corpus replay name them.
pub fn body_of_kind(kind: MessageKind, data: &[u8]) -> bool {
    crate::messages::fuzz_body(kind, data)
}

#[cfg(test)]
mod tests {
    //! CI replays what the fuzzers found instead of fuzzing: the golden envelopes (the seed
    //! corpus) and every file under `protocol/fuzz/corpus/<target>/`.
    use std::path::{Path, PathBuf};

    use super::*;

    fn files(dir: &Path) -> Vec<PathBuf> {
        match std::fs::read_dir(dir) {
            Ok(entries) => entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    #[test]
    fn golden_envelopes_decode_through_the_fuzz_entry_points() {
        let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
        for kind in MessageKind::ALL {
            let text =
                std::fs::read_to_string(golden.join(format!("{}.hex", kind.name()))).unwrap();
            let bytes = crate::unhex(text.trim()).unwrap();
            envelope(&bytes);
            let body = &bytes[HEADER_LEN..bytes.len() - SIGNATURE_LEN];
            assert!(
                body_of_kind(*kind, body),
                "{kind}: golden body did not decode"
            );
        }
    }

    #[test]
    fn fuzz_corpus_replays_without_panics() {
        let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
        let mut replayed = 0;
        for file in files(&corpus.join("envelope")) {
            envelope(&std::fs::read(&file).unwrap());
            replayed += 1;
        }
        for file in files(&corpus.join("money")) {
            money(&std::fs::read(&file).unwrap());
            replayed += 1;
        }
        for kind in MessageKind::ALL {
            let dir = corpus.join(format!("body_{}", kind.name().to_ascii_lowercase()));
            for file in files(&dir) {
                body_of_kind(*kind, &std::fs::read(&file).unwrap());
                replayed += 1;
            }
        }
        for file in files(&corpus.join("ledger_wire")) {
            ledger_wire(&std::fs::read(&file).unwrap());
            replayed += 1;
        }
        // The corpus is committed; an empty replay means it went missing.
        assert!(replayed > 0, "no fuzz corpus under {}", corpus.display());
    }
}

//! Golden bytes: every message kind's encoding is pinned, so an accidental change to any
//! wire type fails here. Regenerate deliberately with `GPUX_BLESS=1 cargo test -p
//! gpux-protocol golden` (and bump the kind's version if the meaning changed; see
//! docs/protocol.md).

use std::path::PathBuf;

use gpux_protocol::*;

use crate::samples;

fn golden_path(kind: MessageKind) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{}.hex", kind.name()))
}

#[test]
fn every_kind_has_a_sample() {
    let kinds: Vec<MessageKind> = samples::all_signed().into_iter().map(|(k, _)| k).collect();
    assert_eq!(kinds, MessageKind::ALL.to_vec());
}

#[test]
fn golden_bytes_are_pinned() {
    let bless = std::env::var_os("GPUX_BLESS").is_some();
    let mut failures = Vec::new();
    for (kind, bytes) in samples::all_signed() {
        let path = golden_path(kind);
        let text = format!("{}\n", hex(&bytes));
        if bless {
            std::fs::write(&path, &text).unwrap();
            continue;
        }
        let pinned = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run with GPUX_BLESS=1 once)", path.display()));
        if pinned != text {
            failures.push(kind);
        }
    }
    assert!(failures.is_empty(), "encoding changed for {failures:?}");
}

#[test]
fn golden_files_still_verify() {
    // Old bytes must keep verifying: this is what a peer running the previous build sends.
    for kind in MessageKind::ALL {
        let text = std::fs::read_to_string(golden_path(*kind)).unwrap();
        let bytes = unhex(text.trim()).unwrap();
        let verified = AnySigned::from_bytes(bytes).unwrap().verify().unwrap();
        assert_eq!(verified.kind(), *kind);
    }
}

/// Envelopes of older versions that this build still reads (`tests/golden/older/`): the
/// bytes a host's store holds for a lease that ran across its upgrade, and what a peer on
/// the previous build sends. Each verifies, keeps its id, and reads into today's type.
#[test]
fn older_versions_still_verify_and_read_into_todays_types() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/older");
    let read = |name: &str| unhex(std::fs::read_to_string(dir.join(name)).unwrap().trim()).unwrap();
    // UsageReceipt version 1: its workspace charge was ext key 1.
    let v1 = read("UsageReceipt.v1.hex");
    assert_eq!(v1[5], 1);
    let receipt = Signed::<UsageReceipt>::from_bytes(v1.clone())
        .unwrap()
        .verify()
        .unwrap();
    assert_eq!(receipt.id(), ContentId::of(&v1));
    assert_eq!(receipt.workspace_charge, MicroCredits::ZERO);
    assert_eq!(receipt.seq, 1);
    // The acknowledgement of it, and the redemption that carries both, as the ledger gets them.
    let ack = Signed::<ReceiptAck>::from_bytes(read("ReceiptAck.receipt-v1.hex"))
        .unwrap()
        .verify()
        .unwrap();
    assert_eq!(ack.receipt, receipt.id());
    validate::ack_matches_receipt(&ack, &receipt, ack.signer()).unwrap();
    let redeem = Signed::<Redeem>::from_bytes(read("Redeem.receipt-v1.hex"))
        .unwrap()
        .verify()
        .unwrap();
    let carried = AnySigned::from_bytes(redeem.receipt.to_vec())
        .unwrap()
        .verify()
        .unwrap();
    assert_eq!(carried.kind(), MessageKind::UsageReceipt);
    // LeaseAccept version 1: its terms were ext keys 1 to 4; the sample announced none,
    // which version 1 meant as a receipt a minute, 30 s of grace and 30 s of notice.
    let v1 = read("LeaseAccept.v1.hex");
    assert_eq!(v1[5], 1);
    let accept = Signed::<LeaseAccept>::from_bytes(v1.clone())
        .unwrap()
        .verify()
        .unwrap();
    assert_eq!(accept.id(), ContentId::of(&v1));
    assert_eq!(
        (
            accept.receipt_interval_ms,
            accept.ack_grace_ms,
            accept.spot_notice_ms,
            accept.starts_at
        ),
        (60_000, 30_000, 30_000, None)
    );
    // LeaseRequest version 4: its terms were ext keys 1 to 8; the sample had none.
    let v4 = read("LeaseRequest.v4.hex");
    assert_eq!(v4[5], 4);
    let request = Signed::<LeaseRequest>::from_bytes(v4.clone())
        .unwrap()
        .verify()
        .unwrap();
    assert_eq!(request.id(), ContentId::of(&v4));
    assert_eq!(request.terms, LeaseTerms::default());
    // The lease it names is the one the older receipt bills.
    assert_eq!(receipt.lease, request.id());
    // Offer version 4: its terms were ext keys 1 to 8; the sample had none. It is the offer
    // the older request matched.
    let v4 = read("Offer.v4.hex");
    assert_eq!(v4[5], 4);
    let offer = Signed::<Offer>::from_bytes(v4.clone())
        .unwrap()
        .verify()
        .unwrap();
    assert_eq!(offer.terms, OfferTerms::default());
    assert_eq!(request.offer, offer.id());
    // Every file there is one this build reads.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let bytes = unhex(
            std::fs::read_to_string(entry.unwrap().path())
                .unwrap()
                .trim(),
        )
        .unwrap();
        AnySigned::from_bytes(bytes).unwrap().verify().unwrap();
    }
}

fn round_trip<T: Message + PartialEq + serde::Serialize + serde::de::DeserializeOwned>(
    bytes: &[u8],
) {
    let verified = Signed::<T>::from_bytes(bytes.to_vec())
        .unwrap()
        .verify()
        .unwrap();
    assert_eq!(verified.as_bytes(), bytes);
    assert_eq!(verified.id(), ContentId::of(bytes));
    // Signing is deterministic (RFC 8032), so re-signing the decoded body gives the same bytes.
    let key = [samples::host(), samples::renter(), samples::ledger()]
        .into_iter()
        .find(|k| k.public() == verified.signer())
        .unwrap();
    let again = Signed::sign(&key, verified.body().clone()).unwrap();
    assert_eq!(again.as_bytes(), bytes, "{}", T::KIND);
    // JSON (the local API's form) round-trips too.
    let json = serde_json::to_string(verified.body()).unwrap();
    let back: T = serde_json::from_str(&json).unwrap();
    assert_eq!(&back, verified.body());
}

#[test]
fn every_kind_round_trips() {
    for (kind, bytes) in samples::all_signed() {
        match kind {
            MessageKind::Attestation => round_trip::<Attestation>(&bytes),
            MessageKind::Offer => round_trip::<Offer>(&bytes),
            MessageKind::OfferWithdrawal => round_trip::<OfferWithdrawal>(&bytes),
            MessageKind::Bid => round_trip::<Bid>(&bytes),
            MessageKind::LeaseRequest => round_trip::<LeaseRequest>(&bytes),
            MessageKind::LeaseAccept => round_trip::<LeaseAccept>(&bytes),
            MessageKind::LeaseReject => round_trip::<LeaseReject>(&bytes),
            MessageKind::LeaseEnd => round_trip::<LeaseEnd>(&bytes),
            MessageKind::PreemptionNotice => round_trip::<PreemptionNotice>(&bytes),
            MessageKind::UsageReceipt => round_trip::<UsageReceipt>(&bytes),
            MessageKind::ReceiptAck => round_trip::<ReceiptAck>(&bytes),
            MessageKind::ChallengeRequest => round_trip::<ChallengeRequest>(&bytes),
            MessageKind::ChallengeResponse => round_trip::<ChallengeResponse>(&bytes),
            MessageKind::LogChunk => round_trip::<LogChunk>(&bytes),
            MessageKind::EscrowLock => round_trip::<EscrowLock>(&bytes),
            MessageKind::Redeem => round_trip::<Redeem>(&bytes),
            MessageKind::Release => round_trip::<Release>(&bytes),
            MessageKind::LedgerRecord => round_trip::<LedgerRecord>(&bytes),
            MessageKind::ChallengeResult => round_trip::<ChallengeResult>(&bytes),
            MessageKind::LeaseCommit => round_trip::<LeaseCommit>(&bytes),
            MessageKind::FaucetGrant => round_trip::<FaucetGrant>(&bytes),
            MessageKind::BidWithdrawal => round_trip::<BidWithdrawal>(&bytes),
            other => panic!("no round-trip case for {other}"),
        }
    }
}

#[test]
fn an_offer_book_entry_stays_under_one_kib() {
    let (_, bytes) = samples::all_signed()
        .into_iter()
        .find(|(k, _)| *k == MessageKind::Offer)
        .unwrap();
    assert!(
        bytes.len() < 1024,
        "offer envelope is {} bytes",
        bytes.len()
    );
}

/// The frames of `/gpux/ledger/2` (docs/protocol.md, section 11): one line per sample,
/// `name: hex`, in `golden/ledger2.frames`.
#[test]
fn ledger_frames_are_pinned_and_decode_exactly() {
    use gpux_protocol::ledger_wire::{self, LedgerRequest, LedgerResponse};
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/ledger2.frames");
    let frames = samples::ledger_frames();
    let text: String = frames
        .iter()
        .map(|(name, bytes)| format!("{name}: {}\n", hex(bytes)))
        .collect();
    if std::env::var_os("GPUX_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let pinned = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with GPUX_BLESS=1 once)", path.display()));
    assert_eq!(pinned, text, "a /gpux/ledger/2 frame's encoding changed");
    for (name, bytes) in &frames {
        let request = ledger_wire::decode::<LedgerRequest>(bytes);
        let response = ledger_wire::decode::<LedgerResponse>(bytes);
        assert!(
            request.is_ok() || response.is_ok(),
            "{name} does not decode"
        );
        // Trailing bytes are refused.
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(ledger_wire::decode::<LedgerRequest>(&longer).is_err() || request.is_err());
        assert!(ledger_wire::decode::<LedgerResponse>(&longer).is_err() || response.is_err());
    }
    // The voucher the sample release carries is the sample acknowledgement, and the release
    // stays within its kind's 512-byte limit.
    let LedgerRequest::Submit(envelope) = ledger_wire::decode(&frames[0].1).unwrap() else {
        panic!("the first sample is a submission");
    };
    assert!(
        envelope.len() <= MessageKind::Release.max_bytes(),
        "{}",
        envelope.len()
    );
    let release = Signed::<Release>::from_bytes(envelope)
        .unwrap()
        .verify()
        .unwrap();
    let ack = release.voucher().unwrap();
    assert!(
        Signed::<ReceiptAck>::from_bytes(ack.to_vec())
            .unwrap()
            .verify()
            .is_ok()
    );
    assert!(
        ledger_wire::decode::<LedgerRequest>(&vec![0; ledger_wire::MAX_LEDGER_FRAME + 1]).is_err()
    );
}

#[test]
fn r011_a_ledger_frame_has_one_spelling() {
    use gpux_protocol::ledger_wire::{self, LedgerRequest, LedgerResponse};
    // Found by the `ledger_wire` fuzz target: the variant index 0 written as bincode's
    // 4-byte varint (`fc 00 00 00 00`) decoded as `Submit(empty)`, which encodes as `00 00`.
    let long = [0xfc, 0, 0, 0, 0, 0];
    assert_eq!(
        ledger_wire::decode::<LedgerRequest>(&long),
        Err(ledger_wire::FrameError::NonCanonical)
    );
    assert!(ledger_wire::decode::<LedgerRequest>(&[0, 0]).is_ok());
    for (_, bytes) in samples::ledger_frames() {
        // Every pinned frame is canonical.
        let r = ledger_wire::decode::<LedgerRequest>(&bytes);
        let a = ledger_wire::decode::<LedgerResponse>(&bytes);
        assert!(r.is_ok() || a.is_ok());
    }
}

/// docs/protocol.md, section 12, names the ids of the samples that others refer to: they
/// are the golden files' ids.
#[test]
fn the_ids_the_protocol_document_names_are_the_golden_files_ids() {
    let doc = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/protocol.md"),
    )
    .unwrap();
    let mut checked = 0;
    let mut wrong = Vec::new();
    for line in doc.lines() {
        // | `Offer.hex` | `c005...` | ... |
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(file), Some(id)) = (cells.get(1), cells.get(2)) else {
            continue;
        };
        let Some(file) = file
            .strip_prefix('`')
            .and_then(|f| f.split('`').next())
            .filter(|f| f.ends_with(".hex"))
        else {
            continue;
        };
        let Some(id) = id.strip_prefix('`').and_then(|i| i.strip_suffix('`')) else {
            continue;
        };
        if id.len() != 64 {
            continue;
        }
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(file);
        let bytes = unhex(std::fs::read_to_string(&path).unwrap().trim()).unwrap();
        let actual = hex(&ContentId::of(&bytes).0);
        if actual != id {
            wrong.push(format!(
                "{file}: the document says {id}, its id is {actual}"
            ));
        }
        checked += 1;
    }
    assert!(wrong.is_empty(), "docs/protocol.md, section 12: {wrong:#?}");
    assert!(checked >= 5, "only {checked} ids found in docs/protocol.md");
}

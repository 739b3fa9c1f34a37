//! The envelope's framing, strict verification, decode limits, and batch verification.

use ed25519_dalek::{Signer, SigningKey};
use gpux_protocol::*;

use crate::samples::{self, T0};

fn accept() -> LeaseAccept {
    gpux_testkit::accept(ContentId([3; 32]), T0)
}

/// Builds an envelope around arbitrary body bytes and signs it correctly, as a rogue peer
/// with a real key could.
fn rogue_envelope(kind: MessageKind, body: &[u8]) -> Vec<u8> {
    let key = SigningKey::from_bytes(&[0x42; 32]);
    let mut bytes = MAGIC.to_vec();
    bytes.push(kind.code());
    bytes.push(kind.version());
    bytes.extend_from_slice(key.verifying_key().as_bytes());
    bytes.extend_from_slice(body);
    let sig = key.sign(&bytes);
    bytes.extend_from_slice(&sig.to_bytes());
    bytes
}

fn body_of(bytes: &[u8]) -> &[u8] {
    &bytes[HEADER_LEN..bytes.len() - SIGNATURE_LEN]
}

#[test]
fn every_single_bit_flip_is_refused() {
    let signed = Signed::sign(&samples::host(), accept()).unwrap();
    let bytes = signed.as_bytes();
    for bit in 0..bytes.len() * 8 {
        let mut forged = bytes.to_vec();
        forged[bit / 8] ^= 1 << (bit % 8);
        let verdict = Signed::<LeaseAccept>::from_bytes(forged).and_then(Signed::verify);
        assert!(verdict.is_err(), "bit {bit} flipped still verified");
    }
}

#[test]
fn framing_errors_are_distinct() {
    let good = Signed::sign(&samples::host(), accept())
        .unwrap()
        .as_bytes()
        .to_vec();
    let err = |b: Vec<u8>| Signed::<LeaseAccept>::from_bytes(b).unwrap_err();

    assert!(matches!(
        err(good[..50].to_vec()),
        VerifyError::TooShort { len: 50 }
    ));
    let mut magic = good.clone();
    magic[0] = b'X';
    assert!(matches!(err(magic), VerifyError::BadMagic));
    let mut unknown = good.clone();
    unknown[4] = 200;
    assert!(matches!(err(unknown), VerifyError::UnknownKind(200)));
    let mut version = good.clone();
    version[5] = 3;
    assert!(matches!(
        err(version),
        VerifyError::UnsupportedVersion {
            version: 3,
            supported: 2,
            ..
        }
    ));
    assert!(matches!(
        Signed::<Offer>::from_bytes(good.clone()).unwrap_err(),
        VerifyError::WrongKind {
            expected: MessageKind::Offer,
            found: MessageKind::LeaseAccept
        }
    ));
    let mut large = good;
    large.resize(MessageKind::LeaseAccept.max_bytes() + 1, 0);
    assert!(matches!(err(large), VerifyError::TooLarge { max: 512, .. }));
}

#[test]
fn a_validly_signed_body_with_trailing_bytes_is_refused() {
    let good = Signed::sign(&samples::host(), accept()).unwrap();
    let mut body = body_of(good.as_bytes()).to_vec();
    body.push(0);
    let rogue = rogue_envelope(MessageKind::LeaseAccept, &body);
    let err = Signed::<LeaseAccept>::from_bytes(rogue)
        .unwrap()
        .verify()
        .unwrap_err();
    assert!(
        matches!(
            err,
            VerifyError::Body {
                source: BodyError::TrailingBytes { unread: 1 },
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_validly_signed_non_canonical_body_is_refused() {
    // LeaseAccept = request (32 raw bytes) || created_at (varint) || ext (varint length 0).
    // Re-encode the length of ext (0) as a padded u16 varint: 251, 0, 0.
    let good = Signed::sign(&samples::host(), accept()).unwrap();
    let body = body_of(good.as_bytes());
    let mut padded = body[..body.len() - 1].to_vec();
    padded.extend_from_slice(&[251, 0, 0]);
    let rogue = rogue_envelope(MessageKind::LeaseAccept, &padded);
    let err = Signed::<LeaseAccept>::from_bytes(rogue)
        .unwrap()
        .verify()
        .unwrap_err();
    assert!(
        matches!(
            err,
            VerifyError::Body {
                source: BodyError::NonCanonical,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_validly_signed_but_invalid_body_is_refused() {
    // An offer whose expiry is before its creation, signed by a rogue peer.
    let att = Signed::sign(&samples::host(), samples::attestation()).unwrap();
    let mut offer = samples::offer_for(&att, 1);
    offer.expires_at = offer.created_at;
    assert!(matches!(
        Signed::sign(&samples::host(), offer.clone()).unwrap_err(),
        SignError::Invalid {
            source: InvalidMessage::TimesOutOfOrder { .. },
            ..
        }
    ));
    let body = bincode::encode_to_vec(&offer, bincode::config::standard()).unwrap();
    let rogue = rogue_envelope(MessageKind::Offer, &body);
    let err = Signed::<Offer>::from_bytes(rogue)
        .unwrap()
        .verify()
        .unwrap_err();
    assert!(matches!(
        err,
        VerifyError::Invalid {
            source: InvalidMessage::TimesOutOfOrder { .. },
            ..
        }
    ));
}

#[test]
fn weak_and_malformed_signer_keys_are_refused() {
    let good = Signed::sign(&samples::host(), accept())
        .unwrap()
        .as_bytes()
        .to_vec();
    // The identity point as signer, with any signature.
    let mut weak = good.clone();
    weak[6..38].copy_from_slice(&{
        let mut id = [0u8; 32];
        id[0] = 1;
        id
    });
    let err = Signed::<LeaseAccept>::from_bytes(weak)
        .unwrap()
        .verify()
        .unwrap_err();
    assert!(matches!(err, VerifyError::Key(KeyError::Weak)), "{err}");
    // y = 2 is not on the curve.
    let mut bad = good;
    bad[6..38].copy_from_slice(&{
        let mut y = [0u8; 32];
        y[0] = 2;
        y
    });
    let err = Signed::<LeaseAccept>::from_bytes(bad)
        .unwrap()
        .verify()
        .unwrap_err();
    assert!(
        matches!(err, VerifyError::Key(KeyError::NotAPoint)),
        "{err}"
    );
}

#[test]
fn signing_refuses_an_oversized_envelope() {
    let mut reject = LeaseReject {
        request: ContentId([0; 32]),
        created_at: T0,
        reason: RejectReason::Invalid,
        detail: BoundedString::new("x".repeat(256)).unwrap(),
        ext: Ext::new(),
    };
    for k in 0..MAX_EXT_FIELDS as u16 {
        reject.ext.insert(k, vec![0; 64]).unwrap();
    }
    assert!(matches!(
        Signed::sign(&samples::host(), reject).unwrap_err(),
        SignError::TooLarge {
            kind: MessageKind::LeaseReject,
            ..
        }
    ));
}

#[test]
fn batch_verification_agrees_with_single_verification() {
    let host = samples::host();
    let mut items = Vec::new();
    for i in 0..64u64 {
        let body = gpux_testkit::accept(ContentId([i as u8; 32]), T0.plus_ms(i));
        let mut bytes = Signed::sign(&host, body).unwrap().as_bytes().to_vec();
        if i % 16 == 5 {
            let last = bytes.len() - 1;
            bytes[last] ^= 0x40; // corrupt the signature
        }
        if i == 9 {
            bytes[HEADER_LEN] ^= 1; // corrupt the body (signed part)
        }
        items.push(Signed::<LeaseAccept>::from_bytes(bytes).unwrap());
    }
    let singles: Vec<bool> = items.iter().cloned().map(|s| s.verify().is_ok()).collect();
    let batch: Vec<bool> = verify_batch(items.clone())
        .iter()
        .map(Result::is_ok)
        .collect();
    assert_eq!(batch, singles);
    assert_eq!(singles.iter().filter(|ok| !**ok).count(), 5);
    // All valid: the batch accepts them all, with ids and signers intact.
    let valid: Vec<_> = items
        .into_iter()
        .zip(&singles)
        .filter(|(_, ok)| **ok)
        .map(|(s, _)| s)
        .collect();
    for (signed, verdict) in valid.clone().into_iter().zip(verify_batch(valid)) {
        let v = verdict.unwrap();
        assert_eq!(v.id(), signed.id());
        assert_eq!(v.signer(), host.public());
    }
}

#[test]
fn batch_filter_sends_small_order_r_to_strict_verification() {
    // A signature whose R is the identity point: refused, whether alone or in a batch.
    let mut bytes = Signed::sign(&samples::host(), accept())
        .unwrap()
        .as_bytes()
        .to_vec();
    let sig_at = bytes.len() - SIGNATURE_LEN;
    bytes[sig_at..sig_at + 32].copy_from_slice(&{
        let mut id = [0u8; 32];
        id[0] = 1;
        id
    });
    let signed = Signed::<LeaseAccept>::from_bytes(bytes).unwrap();
    assert!(signed.clone().verify().is_err());
    assert!(verify_batch(vec![signed])[0].is_err());
}

#[test]
fn any_signed_dispatches_on_the_kind_byte() {
    for (kind, bytes) in samples::all_signed() {
        assert_eq!(peek_kind(&bytes).unwrap(), kind);
        assert_eq!(
            AnySigned::from_bytes(bytes)
                .unwrap()
                .verify()
                .unwrap()
                .kind(),
            kind
        );
    }
}

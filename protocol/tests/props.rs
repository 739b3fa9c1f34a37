//! Property tests: flipped bits never verify, arbitrary bytes never panic a decoder, money
//! text round-trips.

use gpux_protocol::*;
use proptest::prelude::*;

use crate::samples;

fn decode_as_kind(kind: MessageKind, body: &[u8]) {
    let mut bytes = MAGIC.to_vec();
    bytes.push(kind.code());
    bytes.push(kind.version());
    bytes.extend_from_slice(samples::host().public().0.as_slice());
    bytes.extend_from_slice(body);
    bytes.extend_from_slice(&[0; SIGNATURE_LEN]);
    if let Ok(any) = AnySigned::from_bytes(bytes) {
        // The zero signature never verifies; what matters is that nothing panics on the way.
        assert!(any.verify().is_err());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn flipping_any_bit_of_any_message_breaks_it(which in 0usize..22, bit in any::<prop::sample::Index>()) {
        let all = samples::all_signed();
        let (kind, bytes) = &all[which % all.len()];
        let at = bit.index(bytes.len() * 8);
        let mut forged = bytes.clone();
        forged[at / 8] ^= 1 << (at % 8);
        let verdict = AnySigned::from_bytes(forged).and_then(AnySigned::verify);
        prop_assert!(verdict.is_err(), "{kind}: bit {at} flipped still verified");
    }

    #[test]
    fn arbitrary_envelopes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(any) = AnySigned::from_bytes(bytes) {
            prop_assert!(any.verify().is_err());
        }
    }

    #[test]
    fn arbitrary_bodies_never_panic(kind_index in 0usize..22, body in prop::collection::vec(any::<u8>(), 0..1024)) {
        decode_as_kind(MessageKind::ALL[kind_index], &body);
    }

    #[test]
    fn mutated_real_bodies_never_panic(which in 0usize..22, edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        // Starting from real bodies reaches much deeper into the decoders than random bytes.
        let all = samples::all_signed();
        let (kind, bytes) = &all[which % all.len()];
        let mut body = bytes[HEADER_LEN..bytes.len() - SIGNATURE_LEN].to_vec();
        for (at, value) in edits {
            let i = at.index(body.len());
            body[i] = value;
        }
        decode_as_kind(*kind, &body);
    }

    #[test]
    fn data_found_in_place_is_what_decoding_finds(
        len in 0usize..1024,
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in 0usize..3,
        extra in prop::collection::vec(any::<u8>(), 0..3),
    ) {
        use gpux_protocol::plane_wire::{self, FilesResponse};
        let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut frame = plane_wire::encode(&FilesResponse::Data(BoundedBytes::new(data).unwrap()));
        for (at, byte) in edits {
            let i = at.index(frame.len());
            frame[i] = byte;
        }
        frame.truncate(frame.len().saturating_sub(cut));
        frame.extend(extra);
        let decoded = plane_wire::decode::<FilesResponse>(&frame);
        match plane_wire::data_in::<FilesResponse>(&frame) {
            Some(at) => prop_assert!(
                matches!(&decoded, Ok(FilesResponse::Data(d)) if d[..] == frame[at]),
                "found in place but decoded as {decoded:?}"
            ),
            None => prop_assert!(!matches!(decoded, Ok(FilesResponse::Data(_)))),
        }
    }

    #[test]
    fn money_text_round_trips(micros in any::<u64>()) {
        let amount = MicroCredits(micros);
        prop_assert_eq!(amount.amount_text().parse::<MicroCredits>(), Ok(amount));
    }

    #[test]
    fn money_parsing_never_panics(text in "\\PC{0,40}") {
        let _ = text.parse::<MicroCredits>();
    }

    #[test]
    fn cost_is_monotonic_and_floor_exact(secs in 0u64..10_000_000, price in 0u64..100_000_000_000) {
        let price = MicroCredits(price);
        let c = money::cost(secs, price).unwrap();
        let next = money::cost(secs + 1, price).unwrap();
        prop_assert!(next >= c);
        let exact = u128::from(price.0) * u128::from(secs);
        prop_assert!(u128::from(c.0) * 3600 <= exact && exact < (u128::from(c.0) + 1) * 3600);
    }
}

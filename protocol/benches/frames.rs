//! Decoding a workspace copy's data frames (`FilesResponse::Data`, 256 KiB each): what a
//! receiving node does per frame (the bytes found in place, `plane_wire::data_in`, since
//! 2026-12-05), against decoding the frame into a value (its canonical form checked by
//! comparing its re-encoding as it is written, until 2026-12-05) and the way before that
//! (the decoded value re-encoded into a new buffer and compared with the frame, until
//! 2026-12-04), measured in the same run, rounds interleaved.
//!
//! `cargo bench -p gpux-protocol --bench frames -- [--rounds N]`; prints JSON.
#![allow(clippy::unwrap_used, missing_docs)]

use std::time::Instant;

use gpux_protocol::BoundedBytes;
use gpux_protocol::plane_wire::{self, FilesResponse, MAX_FILE_DATA};

/// Distinct frames, cycled (64 of 256 KiB: more than a cache holds).
const FRAMES: usize = 64;
/// Frames decoded per round: 1 GiB.
const PER_ROUND: usize = 4096;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(7usize);
    let frames: Vec<Vec<u8>> = (0..FRAMES)
        .map(|i| {
            let data = (0..MAX_FILE_DATA)
                .map(|j| (j.wrapping_mul(31) ^ i) as u8)
                .collect();
            plane_wire::encode(&FilesResponse::Data(BoundedBytes::new(data).unwrap()))
        })
        .collect();
    let standard = bincode::config::standard();
    let (mut before, mut decoded, mut now) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        for frame in frames.iter().cycle().take(PER_ROUND) {
            let (value, used): (FilesResponse, usize) =
                bincode::decode_from_slice(frame, standard).unwrap();
            assert_eq!(used, frame.len());
            assert!(bincode::encode_to_vec(&value, standard).unwrap() == *frame);
            std::hint::black_box(value);
        }
        before.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        for frame in frames.iter().cycle().take(PER_ROUND) {
            let value: FilesResponse = plane_wire::decode(frame).unwrap();
            std::hint::black_box(value);
        }
        decoded.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        for frame in frames.iter().cycle().take(PER_ROUND) {
            let at = plane_wire::data_in::<FilesResponse>(frame).unwrap();
            std::hint::black_box(&frame[at]);
        }
        now.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let median = |runs: &mut Vec<f64>| {
        runs.sort_by(f64::total_cmp);
        runs[runs.len() / 2]
    };
    let (before, decoded, now) = (median(&mut before), median(&mut decoded), median(&mut now));
    println!(
        "{{\"frames\":{PER_ROUND},\"frame_bytes\":{MAX_FILE_DATA},\"rounds\":{rounds},\"decode_reencode_ms\":{before:.0},\"decode_compare_ms\":{decoded:.0},\"in_place_ms\":{now:.3},\"decode_compare_over_in_place\":{:.0}}}",
        decoded / now.max(1e-6)
    );
}

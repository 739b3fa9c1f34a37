//! The renter's side of a challenge: size it, send it, time the commitments, pick what to
//! check, check it.

use std::time::{Duration, Instant};

use gpux_attestation::challenge::fill::{self, FillPolicy, OpenedBlock};
use gpux_attestation::challenge::{self, Opened, Policy, Timed};
use gpux_protocol::plane_wire::{
    BlockAt, ChallengeAnswer, ChallengeOpen, ChallengePick, FILL_BLOCK_BYTES, Opened as Open,
};
use gpux_protocol::{
    BoundedBytes, BoundedVec, ChallengeRequest, ChallengeResponse, ContentId, Ext, Keypair, Signed,
};
use libp2p::PeerId;

use super::{
    ANSWER_WITHIN, CHALLENGE, ChallengeFailure, Measured, Reference, answer_within, fill_for,
    size_for,
};
use crate::attest::now;
use crate::p2p::Client;
use crate::plane::{FramedStream, OPEN_WITHIN, framed, recv, send};

/// What the host opened after the pick.
#[derive(Default)]
struct Openings {
    rows: Vec<Opened>,
    blocks: Vec<OpenedBlock>,
    bytes: u64,
}

/// Runs the challenge of `lease` on `host` (the renter's side); the request names `device`
/// (the lease's first), which a published result binds.
pub(crate) async fn run(
    net: &Client,
    key: &Keypair,
    (host, device): (gpux_protocol::PublicKey, Option<gpux_protocol::GpuUuid>),
    lease: ContentId,
    reference: Reference,
) -> Result<Measured, ChallengeFailure> {
    let not_run = |e: String| ChallengeFailure::NotRun(e);
    let failed = |e: String| ChallengeFailure::Failed(e);
    let peer =
        PeerId::from_bytes(&host.peer_id().to_bytes()).map_err(|e| not_run(e.to_string()))?;
    let stream = net
        .open_stream(peer, CHALLENGE, OPEN_WITHIN)
        .await
        .map_err(|e| not_run(format!("opening the challenge: {e}")))?;
    let mut framed = framed(stream);
    let asked = Instant::now();
    send(&mut framed, &ChallengeOpen { lease })
        .await
        .map_err(|e| not_run(e.to_string()))?;
    match recv::<Open>(&mut framed, OPEN_WITHIN).await {
        Ok(Open::Yes) => {}
        Ok(Open::No { detail, .. }) => {
            return Err(not_run(format!("the host refused: {detail}")));
        }
        Err(e) => return Err(not_run(e.to_string())),
    }
    let round_trip = asked.elapsed();
    let shape = size_for(reference.gops, round_trip);
    let fill_shape = fill_for(reference.fill_bytes);
    let mut seed = [0u8; 32];
    let mut coins = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| not_run(e.to_string()))?;
    getrandom::fill(&mut coins).map_err(|e| not_run(e.to_string()))?;
    let request = Signed::sign(
        key,
        ChallengeRequest {
            host,
            created_at: now(),
            seed,
            m: shape.m,
            k: shape.k,
            n: shape.n,
            fill_lanes: fill_shape.map_or(0, |f| f.lanes),
            fill_blocks: fill_shape.map_or(0, |f| f.blocks),
            gpu: device,
            ext: Ext::new(),
        },
    )
    .map_err(|e| not_run(e.to_string()))?;
    let bytes: BoundedBytes<512> =
        BoundedBytes::new(request.as_bytes().to_vec()).map_err(|e| not_run(e.to_string()))?;
    let sent = Instant::now();
    send(&mut framed, &bytes)
        .await
        .map_err(|e| not_run(e.to_string()))?;
    // The fill first, timed to its root; then the product, timed from there to the signed
    // response. A host that has not answered by the time the policy's slowest passing
    // prover would have has failed already: the renter stops waiting there.
    let late = |what: &str, within: Duration, e: String| {
        failed(format!(
            "{what} within {:.1} s, the time {:.0}% of the reference needs: {e}",
            within.as_secs_f64(),
            Policy::default().min_share * 100.0
        ))
    };
    let (fill_root, fill_time) = match fill_shape {
        Some(f) => {
            let at_reference = f.traffic() / (reference.gbs.unwrap_or(f64::INFINITY) * 1e9);
            // Unjudged bandwidth: wait as long as a tenth of the product's own wait allows.
            let within = match reference.gbs {
                Some(_) => answer_within(at_reference, round_trip),
                None => ANSWER_WITHIN / 2,
            };
            match recv::<ChallengeAnswer>(&mut framed, within).await {
                Ok(ChallengeAnswer::Filled(root)) => (Some(root), sent.elapsed()),
                Ok(ChallengeAnswer::Failed(why)) => {
                    return Err(not_run(format!("the host: {why}")));
                }
                Ok(_) => return Err(failed("the host answered out of turn".into())),
                Err(e) => return Err(late("memory: no filled memory", within, e.to_string())),
            }
        }
        None => (None, Duration::ZERO),
    };
    let product_started = Instant::now();
    let within = answer_within(shape.operations() / (reference.gops * 1e9), round_trip);
    let response = match recv::<ChallengeAnswer>(&mut framed, within).await {
        Ok(ChallengeAnswer::Response(bytes)) => bytes,
        Ok(ChallengeAnswer::Failed(why)) => return Err(not_run(format!("the host: {why}"))),
        Ok(_) => return Err(failed("the host answered out of turn".into())),
        Err(e) => return Err(late("tensor throughput: no product", within, e.to_string())),
    };
    let product_time = product_started.elapsed();
    let response_bytes = response.into_inner();
    let response = Signed::<ChallengeResponse>::from_bytes(response_bytes.clone())
        .and_then(Signed::verify)
        .map_err(|e| failed(format!("the host's response does not verify: {e}")))?;
    if response.signer() != host || response.request != request.id() {
        return Err(failed(
            "the response is not the host's answer to this challenge".into(),
        ));
    }
    if response.fill_root != fill_root {
        return Err(failed(
            "the signed response does not repeat the fill's root".into(),
        ));
    }
    // Only now, with the host committed, does it learn what is checked.
    let policy = Policy::default();
    let fill_policy = FillPolicy::default();
    let rows = challenge::pick_rows(&coins, shape.m, &policy);
    let blocks = fill_shape.map_or(Vec::new(), |f| fill::pick_blocks(&coins, f, &fill_policy));
    let pick = ChallengePick {
        rows: BoundedVec::new(rows.clone()).map_err(|e| not_run(e.to_string()))?,
        blocks: BoundedVec::new(
            blocks
                .iter()
                .map(|&(lane, index)| BlockAt { lane, index })
                .collect(),
        )
        .map_err(|e| not_run(e.to_string()))?,
    };
    send(&mut framed, &pick)
        .await
        .map_err(|e| not_run(e.to_string()))?;
    let opened = receive_openings(&mut framed, shape.n, rows.len(), 3 * blocks.len())
        .await
        .map_err(failed)?;
    let checking = Instant::now();
    let (opened_bytes, rows_checked) = (opened.bytes, rows.len() as u32);
    let root = response.rows_root.0;
    let checked = tokio::task::spawn_blocking(move || {
        let product = challenge::verify(
            &seed,
            shape,
            &root,
            &opened.rows,
            Timed {
                observed: product_time,
                reference: reference.gops,
            },
            &policy,
            &coins,
        );
        let filled = match (fill_shape, fill_root) {
            (Some(f), Some(root)) => {
                let openings: Vec<fill::Opening> = opened
                    .blocks
                    .chunks_exact(3)
                    .map(|c| [c[0].clone(), c[1].clone(), c[2].clone()])
                    .collect();
                let timed = Timed {
                    observed: fill_time,
                    reference: reference.gbs.unwrap_or(0.0),
                };
                Some(
                    fill::verify_fill(&seed, f, &root.0, &openings, timed, &fill_policy, &coins)
                        .map(|gbs| (f.bytes(), gbs)),
                )
            }
            _ => None,
        };
        (product, filled)
    })
    .await
    .map_err(|e| not_run(e.to_string()))?;
    // Every measure that fell short, named.
    let mut short = Vec::new();
    if let Some(Err(e)) = &checked.1 {
        short.push(format!("memory: {e}"));
    }
    if let Err(e) = &checked.0 {
        short.push(format!("tensor throughput: {e}"));
    }
    if !short.is_empty() {
        return Err(failed(short.join("; ")));
    }
    let (Ok(verdict), fill) = checked else {
        return Err(failed("the product did not check".into()));
    };
    Ok(Measured {
        shape,
        rows_checked,
        opened_bytes,
        verify: checking.elapsed(),
        achieved_gops: verdict.achieved_gops,
        reference_gops: reference.gops,
        fill: fill
            .and_then(Result::ok)
            .map(|(bytes, gbs)| (bytes, gbs, reference.gbs)),
        round_trip,
        request: request.as_bytes().to_vec(),
        response: response_bytes,
    })
}

/// The picked rows (`rows` of `n` values) and fill blocks (`blocks`, three per pick), as the
/// host opens them, then its `Done`.
async fn receive_openings(
    framed: &mut FramedStream,
    n: u32,
    rows: usize,
    blocks: usize,
) -> Result<Openings, String> {
    let mut got = Openings::default();
    loop {
        match recv::<ChallengeAnswer>(framed, ANSWER_WITHIN).await {
            Ok(ChallengeAnswer::Row {
                index,
                values,
                path,
            }) => {
                if got.rows.len() == rows || values.len() != 4 * n as usize {
                    return Err("the host opened rows it was not asked for".into());
                }
                got.bytes += (values.len() + 32 * path.len()) as u64;
                got.rows.push(Opened {
                    index,
                    row: values
                        .chunks_exact(4)
                        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                    path: path.iter().map(|h| h.0).collect(),
                });
            }
            Ok(ChallengeAnswer::Block { at, words, path }) => {
                if got.blocks.len() == blocks || words.len() != FILL_BLOCK_BYTES {
                    return Err("the host opened blocks it was not asked for".into());
                }
                got.bytes += (words.len() + 32 * path.len()) as u64;
                let mut block = [0u64; fill::BLOCK_WORDS];
                for (w, c) in block.iter_mut().zip(words.chunks_exact(8)) {
                    *w = u64::from_le_bytes(c.try_into().unwrap_or_default());
                }
                got.blocks.push(OpenedBlock {
                    lane: at.lane,
                    index: at.index,
                    block,
                    path: path.iter().map(|h| h.0).collect(),
                });
            }
            Ok(ChallengeAnswer::Done) => return Ok(got),
            Ok(_) => return Err("the host answered out of turn".into()),
            Err(e) => return Err(format!("the picked rows and blocks did not arrive: {e}")),
        }
    }
}

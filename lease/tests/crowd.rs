//! Many renters at once against one host: a deterministic simulator of the renting rule
//! (docs/market.md, "Many rents at once"). One host (the pure `HostBook`) offers N GPUs;
//! M <= N rents from up to four renter nodes run at once, their messages delivered in a
//! random order. Each renter node claims GPUs in its own book before asking
//! (`OrderBook::allocate_on`, then `reserve` under a hold), and on a refusal that names free
//! GPUs asks the host again for those, up to three times.
//!
//! The property: every rent gets a lease, and no GPU is in two. A failing schedule prints
//! its seed; `GPUX_SIM_SEED=<seed>` replays it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use gpux_lease::{Answer, HostBook, Timing};
use gpux_market::{Allocation, BidSpec, BookConfig, OrderBook};
use gpux_protocol::*;

use crate::rules::{T0, host, offer, request_by};
use crate::sim::Rng;

/// A rent's state.
enum Rent {
    /// Not asked yet, or asking again with these GPUs first.
    Ready {
        prefer: Vec<GpuUuid>,
    },
    /// A request in flight, under this node's hold.
    Asking {
        hold: ContentId,
        allocation: Allocation,
    },
    Leased(GpuUuid),
    Failed(String),
}

/// One rent: its node, its state, the GPUs refused to it, how often it asked.
struct Task {
    node: usize,
    state: Rent,
    avoid: Vec<GpuUuid>,
    asked: usize,
}

fn spec() -> BidSpec {
    BidSpec {
        query: gpux_market::query::Query::default(),
        gpus: 1,
        max_price: MicroCredits(3_600_000),
        duration_s: 120,
        kind: LeaseKind::OnDemand,
        allow_spread: false,
    }
}

/// A rent claims GPUs of the offer in its node's book (those in `prefer` first, none it
/// was refused) under a hold, and sends its request; more than four asks is a failure.
fn ask(
    task: &mut Task,
    i: usize,
    prefer: Vec<GpuUuid>,
    (books, keys, offered): (&mut [OrderBook], &[Keypair], &Verified<Offer>),
    t: u64,
    to_host: &mut VecDeque<(usize, Verified<LeaseRequest>)>,
) -> Result<(), String> {
    if task.asked > 3 {
        task.state = Rent::Failed(format!("asked {} times", task.asked));
        return Ok(());
    }
    let book = &mut books[task.node];
    let Some(allocation) =
        book.allocate_on(&offered.id(), &spec(), Timestamp(t), (&prefer, &task.avoid))
    else {
        task.state = Rent::Failed("nothing free in its node's book".into());
        return Ok(());
    };
    let mut hold = ContentId([0xff; 32]);
    hold.0[..8].copy_from_slice(&(i as u64).to_le_bytes());
    hold.0[8..16].copy_from_slice(&(task.asked as u64).to_le_bytes());
    book.reserve(&allocation, hold)
        .map_err(|e| format!("a claim that allocate_on found failed: {e:?}"))?;
    task.asked += 1;
    let request = request_by(
        &keys[task.node],
        offered,
        allocation.gpus[0],
        t,
        LeaseKind::OnDemand,
    );
    to_host.push_back((i, request));
    task.state = Rent::Asking { hold, allocation };
    Ok(())
}

/// One schedule; `Err` says which rule broke.
fn run(seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let n = rng.range(1, 16) as u8;
    let m = rng.range(1, u64::from(n)) as usize;
    let nodes = rng.range(1, 4) as usize;
    let mut body = offer(T0).body().clone();
    body.gpus = BoundedVec::new(
        (0..n)
            .map(|i| OfferGpu {
                uuid: GpuUuid::Gpu([i + 10; 16]),
                ..body.gpus[0].clone()
            })
            .collect(),
    )
    .unwrap();
    let offered = Signed::sign(&host(), body).unwrap();
    let mut host_book = HostBook::new(host(), Timing::default());
    host_book.add_offer(offered.clone(), Timestamp(T0));
    let keys: Vec<Keypair> = (0..nodes)
        .map(|i| Keypair::from_seed(&[100 + i as u8; 32]))
        .collect();
    let mut books: Vec<OrderBook> = (0..nodes)
        .map(|_| {
            let mut book = OrderBook::new(BookConfig::default());
            book.insert(&offered, Timestamp(T0)).unwrap();
            book
        })
        .collect();
    let mut tasks: Vec<Task> = (0..m)
        .map(|i| Task {
            node: i % nodes,
            state: Rent::Ready { prefer: Vec::new() },
            avoid: Vec::new(),
            asked: 0,
        })
        .collect();
    // Requests on their way to the host, answers on their way back.
    let mut to_host: VecDeque<(usize, Verified<LeaseRequest>)> = VecDeque::new();
    let mut to_renter: VecDeque<(usize, Answer)> = VecDeque::new();
    let mut t = T0 + 1;
    for _ in 0..10_000 {
        t += 1;
        let ready: Vec<usize> = (0..m)
            .filter(|&i| matches!(tasks[i].state, Rent::Ready { .. }))
            .collect();
        let choices = ready.len() + to_host.len().min(1) + to_renter.len().min(1);
        if choices == 0 {
            break;
        }
        let pick = rng.range(0, choices as u64 - 1) as usize;
        if pick < ready.len() {
            // A rent claims GPUs in its node's book and asks.
            let i = ready[pick];
            let Rent::Ready { prefer } =
                std::mem::replace(&mut tasks[i].state, Rent::Failed(String::new()))
            else {
                unreachable!()
            };
            ask(
                &mut tasks[i],
                i,
                prefer,
                (&mut books, &keys, &offered),
                t,
                &mut to_host,
            )?;
        } else if pick == ready.len() && !to_host.is_empty() {
            // The host answers a request (any in flight).
            let k = rng.range(0, to_host.len() as u64 - 1) as usize;
            let (i, request) = to_host.remove(k).unwrap();
            let answer = host_book.handle_request(request, Timestamp(t), false);
            to_renter.push_back((i, answer));
        } else if !to_renter.is_empty() {
            let k = rng.range(0, to_renter.len() as u64 - 1) as usize;
            let (i, answer) = to_renter.remove(k).unwrap();
            let task = &mut tasks[i];
            let Rent::Asking { hold, allocation } =
                std::mem::replace(&mut task.state, Rent::Failed(String::new()))
            else {
                unreachable!()
            };
            books[task.node].release(&hold);
            match answer {
                Answer::Accepted { lease, .. } => {
                    books[task.node].reserve(&allocation, lease.id()).ok();
                    task.state = Rent::Leased(allocation.gpus[0]);
                }
                Answer::Rejected { reason, envelope } => {
                    let reject = Signed::<LeaseReject>::from_bytes(envelope)
                        .and_then(Signed::verify)
                        .unwrap();
                    match reject_free_gpus(&reject) {
                        // Asked again at once for the GPUs named, as the node does.
                        Some(free) if reason == RejectReason::GpusUnavailable => {
                            task.avoid.extend(allocation.gpus.iter().copied());
                            ask(
                                task,
                                i,
                                free,
                                (&mut books, &keys, &offered),
                                t,
                                &mut to_host,
                            )?;
                        }
                        _ => {
                            task.state =
                                Rent::Failed(format!("{reason:?}: {}", reject.detail.as_str()))
                        }
                    }
                }
            }
        }
    }
    let mut leased = BTreeSet::new();
    let mut outcomes = BTreeMap::new();
    for (i, task) in tasks.iter().enumerate() {
        match &task.state {
            Rent::Leased(gpu) => {
                if !leased.insert(*gpu) {
                    return Err(format!("seed {seed}: GPU {gpu} leased twice"));
                }
            }
            Rent::Failed(why) => {
                outcomes.insert(i, why.clone());
            }
            _ => return Err(format!("seed {seed}: rent {i} never finished")),
        }
    }
    if !outcomes.is_empty() {
        return Err(format!(
            "seed {seed}: {n} free GPUs, {m} rents from {nodes} renters: {} got none: {outcomes:?}",
            outcomes.len()
        ));
    }
    Ok(())
}

#[test]
fn with_n_free_gpus_every_one_of_m_concurrent_rents_gets_a_lease() {
    let seeds: Vec<u64> = match std::env::var("GPUX_SIM_SEED") {
        Ok(seed) => vec![seed.parse().expect("GPUX_SIM_SEED: a number")],
        Err(_) => (0..500).collect(),
    };
    let failures: Vec<String> = seeds.into_iter().filter_map(|s| run(s).err()).collect();
    assert!(
        failures.is_empty(),
        "{} schedules failed; first: {}",
        failures.len(),
        failures[0]
    );
}

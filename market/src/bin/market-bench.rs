//! Order-book benchmark at scale.
//!
//! `cargo run --release -p gpux-market --bin market-bench -- --offers 1000000 --json`
//!
//! Builds a realistic book (mixed GPU models and prices, hosts of 1–8 GPUs per machine and
//! 1–4 machines each, eight regions, three evidence tiers), with every offer really signed
//! and then verified in batches (reported as `verify_per_s`, timed apart from inserting).
//! Then runs a documented bid mix (docs/benchmarks.md) through matching and top-20 search,
//! and the same bids through the unindexed baseline (every offer evaluated with the same
//! compiled query, then a partial sort), and prints one JSON object.
#![allow(clippy::unwrap_used)]
// The counting allocator below is the one use of unsafe code: forwarding to the system
// allocator while counting live bytes is how `bytes_per_offer` is measured, not estimated.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gpux_market::query::Query;
use gpux_market::{BidSpec, BookConfig, OrderBook};
use gpux_protocol::*;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to `System`; only a counter is updated.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same layout, forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const T0: Timestamp = Timestamp(1_764_460_800_000);
const REGIONS: [&str; 8] = [
    "eu-west",
    "eu-north",
    "eu-central",
    "us-east",
    "us-west",
    "asia-east",
    "asia-south",
    "sa-east",
];

/// (family key, VRAM GB choices, compute capability, base price in micro-credits, weight %)
type Model = (&'static str, &'static [u64], (u8, u8), u64, u32);
const MODELS: [Model; 10] = [
    ("h100", &[80], (9, 0), 2_400_000, 18),
    ("h200", &[141], (9, 0), 3_500_000, 4),
    ("a100", &[40, 80], (8, 0), 1_400_000, 15),
    ("l40s", &[48], (8, 9), 1_000_000, 8),
    ("a40", &[48], (8, 6), 600_000, 7),
    ("l4", &[24], (8, 9), 400_000, 8),
    ("a10", &[24], (8, 6), 450_000, 4),
    ("t4", &[16], (7, 5), 200_000, 4),
    ("rtx4090", &[24], (8, 9), 450_000, 20),
    ("rtx3090", &[24], (8, 6), 250_000, 12),
];

/// A small deterministic generator (splitmix64), so every run builds the same book.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick_model(&mut self) -> usize {
        let mut roll = self.below(100) as u32;
        for (i, m) in MODELS.iter().enumerate() {
            if roll < m.4 {
                return i;
            }
            roll -= m.4;
        }
        0
    }
}

/// CPU models hosts report.
const CPUS: [&str; 4] = [
    "AMD EPYC 9654 96-Core Processor",
    "Intel(R) Xeon(R) Platinum 8480+",
    "AMD Ryzen 9 7950X 16-Core Processor",
    "Intel(R) Core(TM) i9-14900K",
];
/// Images hosts cache (with a few tags each).
const POPULAR: [&str; 8] = [
    "pytorch/pytorch",
    "vllm/vllm-openai",
    "nvidia/cuda",
    "nvcr.io/nvidia/pytorch",
    "tensorflow/tensorflow",
    "ollama/ollama",
    "lmsysorg/sglang",
    "ghcr.io/huggingface/text-generation-inference",
];

fn make_offer(rng: &mut Rng, host: u64, slot: u16, now: Timestamp) -> Offer {
    let (family, vrams, cc, base, _) = MODELS[rng.pick_model()];
    let vram = vrams[rng.below(vrams.len() as u64) as usize];
    let gpus = 1 + rng.below(8) as u8;
    let price = (base * (70 + rng.below(81)) / 100) / 10_000 * 10_000;
    let tier = match rng.below(100) {
        0..70 => EvidenceTier::SelfReported,
        70..95 => EvidenceTier::Challenged,
        _ => EvidenceTier::CcAttested,
    };
    let created_at = Timestamp(now.0 - rng.below(600_000));
    Offer {
        seq: 1,
        slot,
        created_at,
        expires_at: created_at.plus_secs(3600),
        attestation: ContentId(*blake3::hash(&host.to_le_bytes()).as_bytes()),
        gpus: BoundedVec::new(
            (0..gpus)
                .map(|g| {
                    let mut uuid = [0u8; 16];
                    uuid[..8].copy_from_slice(&host.to_le_bytes());
                    uuid[8..10].copy_from_slice(&slot.to_le_bytes());
                    uuid[15] = g;
                    OfferGpu {
                        uuid: GpuUuid::Gpu(uuid),
                        family: BoundedString::new(family).unwrap(),
                        memory_bytes: vram * (1 << 30) - (300 << 20),
                        compute_capability: ComputeCapability::new(cc.0, cc.1),
                        pcie_gen: if cc.0 >= 9 { 5 } else { 4 },
                    }
                })
                .collect(),
        )
        .unwrap(),
        price_per_gpu_hour: MicroCredits(price.max(10_000)),
        spot_floor_per_gpu_hour: (rng.below(10) < 6).then(|| MicroCredits((price / 2).max(10_000))),
        min_duration_s: 60,
        max_duration_s: 7 * 86_400,
        region: BoundedString::new(REGIONS[rng.below(REGIONS.len() as u64) as usize]).unwrap(),
        tier,
        driver: Version::new(550, 54, 15),
        cuda: Version::new(12, 4, 0),
        images: BoundedVec::new(vec![ImageDigest([0xd1; 32])]).unwrap(),
        machine: Machine {
            disk_write_mbps: 500 + rng.below(3000) as u32,
            net_up_mbps: 100 + rng.below(1000) as u32,
            net_down_mbps: 500 + rng.below(10_000) as u32,
            ..Machine::split_evenly(
                CPUS[rng.below(CPUS.len() as u64) as usize],
                16 << rng.below(4),
                (64u64 << 30) << rng.below(4),
                gpus.into(),
            )
        },
        pulls: Pulls {
            max_bytes: 40 << 30,
            timeout_s: 1800,
            registries: BoundedVec::empty(),
            // Hosts cache a few of the popular images (the book interns their names).
            cached: BoundedVec::new(
                (0..rng.below(9))
                    .map(|_| {
                        BoundedString::new(format!(
                            "{}:v{}",
                            POPULAR[rng.below(8) as usize],
                            rng.below(5)
                        ))
                        .unwrap()
                    })
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect(),
            )
            .unwrap(),
        },
        terms: gpux_protocol::OfferTerms::default(),
        ext: Ext::new(),
    }
}

/// Signs `n` offers over the available cores: hosts with 1–4 machines (slots) each.
fn sign_offers(n: usize, threads: usize) -> Vec<Vec<u8>> {
    let per = n.div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut rng = Rng(0x5eed ^ t as u64);
                    let mut out = Vec::with_capacity(per);
                    let mut host = (t as u64) << 40;
                    while out.len() < per && t * per + out.len() < n {
                        host += 1;
                        let mut seed = [0u8; 32];
                        seed[..8].copy_from_slice(&host.to_le_bytes());
                        let key = Keypair::from_seed(&seed);
                        let machines = 1 + rng.below(4) as u16;
                        for slot in 0..machines {
                            if out.len() == per || t * per + out.len() == n {
                                break;
                            }
                            let offer = make_offer(&mut rng, host, slot, T0);
                            out.push(Signed::sign(&key, offer).unwrap().as_bytes().to_vec());
                        }
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

fn verify_all(bytes: Vec<Vec<u8>>, threads: usize) -> Vec<Verified<Offer>> {
    let per = bytes.len().div_ceil(threads);
    let mut chunks: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut it = bytes.into_iter();
    for _ in 0..threads {
        chunks.push(it.by_ref().take(per).collect());
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                s.spawn(move || {
                    let mut out = Vec::with_capacity(chunk.len());
                    let mut it = chunk.into_iter().peekable();
                    while it.peek().is_some() {
                        let batch: Vec<Signed<Offer>> = it
                            .by_ref()
                            .take(256)
                            .map(|b| Signed::<Offer>::from_bytes(b).unwrap())
                            .collect();
                        out.extend(verify_batch(batch).into_iter().map(|r| r.unwrap()));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

/// The bid mix: half single-family with a price cap, a third VRAM/count ranges, the rest
/// multi-constraint with region and tier.
fn bid_mix(n: usize) -> Vec<BidSpec> {
    let mut rng = Rng(0xb1d5);
    (0..n)
        .map(|i| {
            let gpus = 1 + rng.below(4) as u16;
            let text = match i % 6 {
                0..3 => {
                    let (family, _, _, base, _) = MODELS[rng.pick_model()];
                    let cap = base * (80 + rng.below(40)) / 100;
                    format!("gpu={family} price<={}", MicroCredits(cap).amount_text())
                }
                3 | 4 => {
                    let vram = [16, 24, 40, 48, 80][rng.below(5) as usize];
                    format!("vram>={vram} count>={gpus}")
                }
                _ => {
                    let a = MODELS[rng.pick_model()].0;
                    let b = MODELS[rng.pick_model()].0;
                    let region = ["eu", "us", "asia"][rng.below(3) as usize];
                    let tier = ["challenged", "self-reported"][rng.below(2) as usize];
                    format!("gpu in [{a},{b}] region={region} tier>={tier} vram>=24 price<=3")
                }
            };
            BidSpec {
                query: Query::parse(&text).unwrap(),
                gpus,
                max_price: MicroCredits(10_000_000),
                duration_s: 3600,
                kind: LeaseKind::OnDemand,
                allow_spread: false,
            }
        })
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e6
}

fn arg(args: &[String], name: &str) -> Option<usize> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n = arg(&args, "--offers").unwrap_or(1_000_000);
    let bids_n = arg(&args, "--bids").unwrap_or(2_000);
    let scan_n = arg(&args, "--scan-bids").unwrap_or(200).min(bids_n);
    let json = args.iter().any(|a| a == "--json");
    let threads = std::thread::available_parallelism().map_or(1, |p| p.get());
    let started = Instant::now();
    let say = |msg: String| {
        if !json {
            eprintln!("[{:>6.1}s] {msg}", started.elapsed().as_secs_f64());
        }
    };

    say(format!("signing {n} offers on {threads} threads"));
    let signed = sign_offers(n, threads);
    say("verifying in batches of 256".into());
    let t = Instant::now();
    let verified = verify_all(signed, threads);
    let verify_s = t.elapsed().as_secs_f64();

    say("inserting".into());
    let before = LIVE.load(Ordering::Relaxed);
    // The bench measures the indexes at a million offers: no bound.
    let mut book = OrderBook::new(BookConfig {
        max_offers: usize::MAX,
        max_offers_per_host: usize::MAX,
        ..BookConfig::default()
    });
    let t = Instant::now();
    for offer in &verified {
        book.insert(offer, T0).unwrap();
    }
    let insert_s = t.elapsed().as_secs_f64();
    let book_bytes = LIVE.load(Ordering::Relaxed).saturating_sub(before);
    drop(verified);

    say(format!("matching and searching {bids_n} bids"));
    let bids = bid_mix(bids_n);
    let (mut matched, mut matches, mut searches) = (0usize, Vec::new(), Vec::new());
    for spec in &bids {
        let t = Instant::now();
        let m = book.match_bid(spec, T0);
        matches.push(t.elapsed());
        matched += usize::from(m.is_ok());
        let t = Instant::now();
        let hits = book.search(&spec.query, T0, 20);
        searches.push(t.elapsed());
        std::hint::black_box(hits);
    }
    say(format!("baseline: scanning for {scan_n} of the same bids"));
    let mut scans = Vec::new();
    for spec in &bids[..scan_n] {
        let t = Instant::now();
        let m = book.scan_match_bid(spec, T0);
        scans.push(t.elapsed());
        // The baseline must agree with the index.
        assert_eq!(
            m.map(|a| a.offer),
            book.match_bid(spec, T0).ok().map(|a| a[0].offer)
        );
    }
    matches.sort_unstable();
    searches.sort_unstable();
    scans.sort_unstable();
    let indexed_same_bids: Vec<Duration> = {
        let mut v: Vec<Duration> = bids[..scan_n]
            .iter()
            .map(|spec| {
                let t = Instant::now();
                std::hint::black_box(book.match_bid(spec, T0).ok());
                t.elapsed()
            })
            .collect();
        v.sort_unstable();
        v
    };
    let match_p50 = percentile(&matches, 0.50);
    let scan_p50 = percentile(&scans, 0.50);
    let report = format!(
        concat!(
            "{{\"offers\":{},\"threads\":{},\"verify_per_s\":{:.0},\"insert_per_s\":{:.0},",
            "\"match_p50_us\":{:.1},\"match_p99_us\":{:.1},\"search_top20_p50_us\":{:.1},\"search_top20_p99_us\":{:.1},",
            "\"bytes_per_offer\":{:.0},\"scan_match_p50_us\":{:.1},\"indexed_match_p50_us_same_bids\":{:.1},",
            "\"speedup_vs_scan\":{:.1},\"bids\":{},\"bids_matched\":{},\"scan_bids\":{},\"elapsed_s\":{:.1}}}"
        ),
        book.len(),
        threads,
        n as f64 / verify_s,
        n as f64 / insert_s,
        match_p50,
        percentile(&matches, 0.99),
        percentile(&searches, 0.50),
        percentile(&searches, 0.99),
        book_bytes as f64 / n as f64,
        scan_p50,
        percentile(&indexed_same_bids, 0.50),
        scan_p50 / percentile(&indexed_same_bids, 0.50),
        bids_n,
        matched,
        scan_n,
        started.elapsed().as_secs_f64(),
    );
    println!("{report}");
}

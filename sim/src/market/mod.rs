//! The market at scale, in simulated time: every host is a real [`HostBook`] holding its
//! signed offer, every lease is the real [`HostLease`] and [`RenterLease`], and settlement is
//! one real [`LedgerMachine`]; every envelope between them is signed, sent as bytes and
//! verified on arrival, as the node's shell does. What is modelled is the rest: links are
//! delays (no bytes move), containers start and stop on time, and a renter sees each host's
//! free GPUs as they were one gossip delay ago (drawn from the measured spread of its
//! family's topic).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gpux_lease::{
    HostBook, HostInput, HostLease, LedgerCall, LedgerMachine, RenterInput, RenterLease, Timing,
};
use gpux_market::LedgerConfig;
use gpux_protocol::{
    BoundedString, BoundedVec, ComputeCapability, ContentId, EscrowId, EvidenceTier, Ext, GpuUuid,
    ImageDigest, Keypair, LeaseKind, LeaseRequest, MicroCredits, Offer, OfferGpu, OfferWithdrawal,
    PublicKey, ResourceLimits, Signed, Timestamp, Verified, Version,
};
use rand::Rng;
use rand::rngs::StdRng;
use serde::Serialize;

mod effects;

/// The simulated clock's origin, unix ms (any time the protocol's rules accept).
const T0: u64 = 1_800_000_000_000;
/// Price: 3.60 credits per GPU-hour, 1,000 micro-credits per GPU-second.
const PRICE: MicroCredits = MicroCredits(3_600_000);
/// Credits minted to each renter: enough for every lease it can take in the run.
const RENTER_FUNDS: u64 = 1_000_000_000_000;
/// How often a host samples a running container's usage, ms.
const SAMPLE_MS: u64 = 10_000;
/// Docker's time to start a container, stop one, and erase one, ms.
const START_MS: u64 = 800;
const STOP_MS: u64 = 300;
const ERASE_MS: u64 = 100;
/// How many hosts a renter looks at for one with enough free GPUs before it waits.
const LOOKS: usize = 64;
/// A renter that found no free host (as it sees them) looks again after this, ms.
const LOOK_AGAIN_MS: u64 = 30_000;

/// What the market part of a run is made of.
#[derive(Debug, Clone, Serialize)]
pub struct MarketParams {
    /// Hosts.
    pub hosts: usize,
    /// Renters.
    pub renters: usize,
    /// GPU families (the first ones of the protocol's table), popular ones first.
    pub families: usize,
    /// Simulated time, ms.
    pub duration_ms: u64,
    /// A lease's length is drawn uniformly between these, s.
    pub lease_s: (u32, u32),
    /// A renter's pause between the end of one lease and its next rent, mean, s
    /// (exponential).
    pub think_mean_s: u64,
    /// Receipt timing (every lease's).
    pub timing: Timing,
    /// One-way link delay and jitter, ms.
    pub link_ms: u64,
    /// ±, ms.
    pub jitter_ms: u64,
    /// Rent attempts (hosts asked) before a renter gives up on one rent.
    pub attempts: u32,
}

/// A family's share of hosts and renters: Zipf, the first family the most popular.
pub fn family_weights(families: usize) -> Vec<f64> {
    let raw: Vec<f64> = (0..families).map(|i| 1.0 / (i as f64 + 1.0)).collect();
    let sum: f64 = raw.iter().sum();
    raw.iter().map(|w| w / sum).collect()
}

fn draw_family(weights: &[f64], rng: &mut StdRng) -> usize {
    let x: f64 = rng.random();
    let mut acc = 0.0;
    for (i, w) in weights.iter().enumerate() {
        acc += w;
        if x < acc {
            return i;
        }
    }
    weights.len() - 1
}

struct Host {
    key: Keypair,
    family: usize,
    gpus: Vec<GpuUuid>,
    book: HostBook,
    offer: ContentId,
    /// Its booked GPUs over time (bit i: GPU i), most recent last: what renters see.
    busy: Vec<(u64, u8)>,
}

struct Renter {
    key: Keypair,
    family: usize,
    want: usize,
}

#[derive(Default)]
struct Container {
    started_at: Option<u64>,
    finished_at: Option<u64>,
}

struct Lease {
    host: u32,
    renter: u32,
    id: ContentId,
    h: Option<HostLease>,
    r: Option<RenterLease>,
    container: Container,
    first_try_at: u64,
    /// The renter has moved on (its next rent is scheduled).
    renter_done: bool,
}

enum Ev {
    /// A renter looks for a host.
    Look {
        renter: u32,
        attempt: u32,
        since: u64,
    },
    RequestAtHost {
        renter: u32,
        host: u32,
        request: Box<Verified<LeaseRequest>>,
        attempt: u32,
        since: u64,
    },
    AcceptAtRenter {
        lease: u32,
        request: Box<Verified<LeaseRequest>>,
        envelope: Vec<u8>,
    },
    HostIn {
        lease: u32,
        input: HostInput,
    },
    RenterIn {
        lease: u32,
        input: RenterInput,
    },
    ReceiptAtRenter {
        lease: u32,
        seq: u64,
        envelope: Vec<u8>,
    },
    LockAtHost {
        lease: u32,
        envelope: Vec<u8>,
    },
    EndAt {
        lease: u32,
        to_host: bool,
        envelope: Vec<u8>,
    },
    LedgerAt {
        lease: u32,
        from_host: bool,
        call: LedgerCall,
        envelope: Vec<u8>,
    },
    ContainerUp {
        lease: u32,
    },
    Sample {
        lease: u32,
    },
}

/// Counts per family of what hosts published on gossip.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Publications {
    /// Publications prompted by a booking change (a lease began or ended): the attestation
    /// and the offer, or a withdrawal when every GPU is booked.
    pub on_change: u64,
    /// Of which withdrawals.
    pub withdrawals: u64,
}

/// What the market part of a run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MarketFigures {
    /// Rents begun (a renter looked for a host).
    pub rents: u64,
    /// Rents whose first host asked accepted.
    pub found_first: u64,
    /// Rents accepted by some host within the attempts.
    pub found: u64,
    /// Requests a host refused (its GPUs were booked by then).
    pub refused: u64,
    /// Looks that found no host with enough free GPUs, as the renter saw them.
    pub nothing_seen: u64,
    /// Leases that reached running.
    pub running: u64,
    /// Leases that ended (the work stopped), and of those settled on the ledger.
    pub ended: u64,
    /// Settled.
    pub settled: u64,
    /// Leases still open when the run stopped.
    pub open_at_end: u64,
    /// Rent (first request) to running, ms: p50, p95.
    pub rent_to_running_p50_ms: u64,
    /// p95.
    pub rent_to_running_p95_ms: u64,
    /// Ledger operations applied, by kind.
    pub ledger_ops: BTreeMap<String, u64>,
    /// Ledger operations per second over the run, all kinds (mean).
    pub ledger_ops_per_s: f64,
    /// The busiest minute's operations per second.
    pub ledger_peak_ops_per_s: f64,
    /// The ledger machine's own CPU time per operation, µs (verify, apply, sign the record).
    pub ledger_us_per_op: f64,
    /// Credits minted, and the ledger's total (balances and escrows) at the end: equal.
    pub minted: u128,
    /// Total.
    pub total: u128,
    /// Receipts hosts signed.
    pub receipts: u64,
    /// Per family: hosts, renters, publications.
    pub per_family: Vec<FamilyFigures>,
    /// Mean signed offer size, bytes, and a withdrawal's.
    pub offer_bytes: f64,
    /// A withdrawal's size.
    pub withdrawal_bytes: u64,
    /// Wall time of the market part, s.
    pub wall_s: f64,
}

/// One family's part.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FamilyFigures {
    /// Its key.
    pub family: String,
    /// Hosts of it.
    pub hosts: u64,
    /// Renters who want it.
    pub renters: u64,
    /// Its hosts' publications on booking changes.
    pub publications: Publications,
}

/// The world.
pub struct Market {
    params: MarketParams,
    rng: StdRng,
    now: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Ev>,
    hosts: Vec<Host>,
    by_family: Vec<Vec<u32>>,
    renters: Vec<Renter>,
    leases: Vec<Lease>,
    ledger: LedgerMachine,
    ledger_key: PublicKey,
    /// Per family: draws of the gossip delay, ms (a renter sees a change this late).
    lag: Vec<Vec<u64>>,
    figures: MarketFigures,
    to_running: Vec<u64>,
    ledger_time: Duration,
    ops_per_minute: BTreeMap<u64, u64>,
    weights: Vec<f64>,
}

fn family_key(i: usize) -> &'static str {
    gpux_protocol::family::FAMILIES
        .get(i)
        .map_or("other", |f| f.key)
}

fn seed_of(kind: u8, i: usize) -> [u8; 32] {
    let mut seed = [kind; 32];
    seed[..8].copy_from_slice(&(i as u64).to_le_bytes());
    seed
}

impl Market {
    /// Builds the market: keys, offers and books for every host, renters with their family
    /// and size, and the ledger with every renter's funds.
    pub fn new(params: MarketParams, rng: StdRng) -> anyhow::Result<Market> {
        let mut rng = rng;
        let weights = family_weights(params.families);
        let ledger_keypair = Keypair::from_seed(&[0xEE; 32]);
        let ledger_key = ledger_keypair.public();
        let ledger = LedgerMachine::new(ledger_keypair, LedgerConfig::default());
        let mut market = Market {
            figures: MarketFigures::default(),
            rng: rand::SeedableRng::seed_from_u64(0),
            now: T0,
            seq: 0,
            queue: BTreeMap::new(),
            hosts: Vec::with_capacity(params.hosts),
            by_family: vec![Vec::new(); params.families],
            renters: Vec::with_capacity(params.renters),
            leases: Vec::new(),
            ledger,
            ledger_key,
            lag: Vec::new(),
            to_running: Vec::new(),
            ledger_time: Duration::ZERO,
            ops_per_minute: BTreeMap::new(),
            weights,
            params,
        };
        let mut offer_bytes = 0u64;
        for i in 0..market.params.hosts {
            let key = Keypair::from_seed(&seed_of(1, i));
            let family = draw_family(&market.weights, &mut rng);
            let n = match rng.random_range(0..10) {
                0..4 => 1,
                4..6 => 2,
                6..8 => 4,
                _ => 8,
            };
            let gpus: Vec<GpuUuid> = (0..n)
                .map(|g| {
                    let mut id = [0u8; 16];
                    id[..8].copy_from_slice(&(i as u64).to_le_bytes());
                    id[8] = g;
                    GpuUuid::Gpu(id)
                })
                .collect();
            let offer = Signed::sign(&key, offer_body(&gpus, family, market.params.duration_ms)?)?;
            offer_bytes += offer.as_bytes().len() as u64;
            let mut book = HostBook::new(key.clone(), market.params.timing);
            let offer_id = offer.id();
            book.add_offer(offer, Timestamp(T0));
            market.by_family[family].push(i as u32);
            market.hosts.push(Host {
                key,
                family,
                gpus,
                book,
                offer: offer_id,
                busy: vec![(0, 0)],
            });
        }
        market.figures.offer_bytes = offer_bytes as f64 / market.params.hosts.max(1) as f64;
        market.figures.withdrawal_bytes = Signed::sign(
            &Keypair::from_seed(&[3; 32]),
            OfferWithdrawal {
                seq: 2,
                created_at: Timestamp(T0),
                offer: ContentId([1; 32]),
                ext: Ext::new(),
            },
        )?
        .as_bytes()
        .len() as u64;
        for i in 0..market.params.renters {
            let key = Keypair::from_seed(&seed_of(2, i));
            market
                .ledger
                .mint(Timestamp(T0), key.public(), MicroCredits(RENTER_FUNDS))
                .map_err(|e| anyhow::anyhow!("minting: {e:?}"))?;
            market.figures.minted += u128::from(RENTER_FUNDS);
            let family = draw_family(&market.weights, &mut rng);
            let want = match rng.random_range(0..10) {
                0..7 => 1,
                7..9 => 2,
                _ => 4,
            };
            market.renters.push(Renter { key, family, want });
            // First rents spread over the first ten minutes.
            let at = rng.random_range(0..600_000);
            market.at(
                at,
                Ev::Look {
                    renter: i as u32,
                    attempt: 0,
                    since: T0 + at,
                },
            );
        }
        market.rng = rng;
        market.figures.per_family = (0..market.params.families)
            .map(|f| FamilyFigures {
                family: family_key(f).to_string(),
                hosts: market.by_family[f].len() as u64,
                renters: market.renters.iter().filter(|r| r.family == f).count() as u64,
                publications: Publications::default(),
            })
            .collect();
        Ok(market)
    }

    /// Each family's subscribers: its hosts and the renters who want it.
    pub fn subscribers(&self) -> Vec<usize> {
        self.figures
            .per_family
            .iter()
            .map(|f| (f.hosts + f.renters) as usize)
            .collect()
    }

    /// Sets how late renters see changes: `lag[f]`, draws of family `f`'s gossip delay, ms.
    pub fn set_lag(&mut self, lag: Vec<Vec<u64>>) {
        self.lag = lag;
    }

    fn at(&mut self, delay: u64, ev: Ev) {
        self.seq += 1;
        self.queue.insert((self.now + delay, self.seq), ev);
    }

    fn link(&mut self) -> u64 {
        let j = self.params.jitter_ms;
        self.params.link_ms + self.rng.random_range(0..=2 * j) - j
    }

    /// Runs to the end of the simulated time and returns the figures.
    pub fn run(mut self) -> MarketFigures {
        let started = Instant::now();
        let end = T0 + self.params.duration_ms;
        while let Some(entry) = self.queue.first_entry() {
            let (t, _) = *entry.key();
            if t > end {
                break;
            }
            let ev = entry.remove();
            self.now = t;
            self.step(ev);
        }
        let f = &mut self.figures;
        f.open_at_end = self
            .leases
            .iter()
            .filter(|l| l.h.is_some() || l.r.is_some())
            .count() as u64;
        f.rent_to_running_p50_ms = crate::gossip::percentile(&mut self.to_running, 50.0);
        f.rent_to_running_p95_ms = crate::gossip::percentile(&mut self.to_running, 95.0);
        let ops: u64 = f.ledger_ops.values().sum();
        f.ledger_ops_per_s = ops as f64 / (self.params.duration_ms as f64 / 1000.0);
        // The busiest whole minute (the first ten, while renters arrive, count too).
        f.ledger_peak_ops_per_s =
            self.ops_per_minute.values().copied().max().unwrap_or(0) as f64 / 60.0;
        f.ledger_us_per_op = self.ledger_time.as_secs_f64() * 1e6 / ops.max(1) as f64;
        f.total = self.ledger.ledger().total();
        f.wall_s = started.elapsed().as_secs_f64();
        self.figures
    }

    /// Whether host `h`'s GPUs, as a renter sees them `lag` ms late, include `want` free
    /// ones: those GPUs.
    fn seen_free(&self, h: usize, lag: u64, want: usize) -> Option<Vec<GpuUuid>> {
        let host = &self.hosts[h];
        let seen_at = (self.now - T0).saturating_sub(lag);
        let mask = host
            .busy
            .iter()
            .rev()
            .find(|(t, _)| *t <= seen_at)
            .map_or(0, |(_, m)| *m);
        let free: Vec<GpuUuid> = host
            .gpus
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) == 0)
            .map(|(_, g)| *g)
            .take(want)
            .collect();
        (free.len() == want).then_some(free)
    }

    fn look(&mut self, renter: u32, attempt: u32, since: u64) {
        if attempt == 0 {
            self.figures.rents += 1;
        }
        let (family, want) = {
            let r = &self.renters[renter as usize];
            (r.family, r.want)
        };
        let candidates = self.by_family[family].len();
        let lags = &self.lag[family];
        for _ in 0..LOOKS.min(candidates.max(1)) {
            if candidates == 0 {
                break;
            }
            let h = self.by_family[family][self.rng.random_range(0..candidates)] as usize;
            let lag = if lags.is_empty() {
                0
            } else {
                lags[self.rng.random_range(0..lags.len())]
            };
            if let Some(gpus) = self.seen_free(h, lag, want) {
                let duration_s = self
                    .rng
                    .random_range(self.params.lease_s.0..=self.params.lease_s.1);
                let request = match self.request(renter as usize, h, gpus, duration_s) {
                    Ok(r) => r,
                    Err(_) => return,
                };
                let d = self.link();
                self.at(
                    d,
                    Ev::RequestAtHost {
                        renter,
                        host: h as u32,
                        request: Box::new(request),
                        attempt,
                        since,
                    },
                );
                return;
            }
        }
        self.figures.nothing_seen += 1;
        self.at(
            LOOK_AGAIN_MS,
            Ev::Look {
                renter,
                attempt,
                since,
            },
        );
    }

    fn request(
        &mut self,
        renter: usize,
        host: usize,
        gpus: Vec<GpuUuid>,
        duration_s: u32,
    ) -> anyhow::Result<Verified<LeaseRequest>> {
        self.seq += 1;
        let mut escrow = [0u8; 16];
        escrow[..8].copy_from_slice(&self.seq.to_le_bytes());
        let amount =
            gpux_protocol::money::cost(gpus.len() as u64 * u64::from(duration_s).max(60), PRICE)?;
        let h = &self.hosts[host];
        Ok(Signed::sign(
            &self.renters[renter].key,
            LeaseRequest {
                created_at: Timestamp(self.now),
                expires_at: Timestamp(self.now + 30_000),
                offer: h.offer,
                host: h.key.public(),
                gpus: BoundedVec::new(gpus)?,
                price_per_gpu_hour: PRICE,
                duration_s,
                kind: LeaseKind::OnDemand,
                image: ImageDigest([4; 32]),
                command: BoundedVec::empty(),
                env: BoundedVec::empty(),
                limits: ResourceLimits {
                    memory_bytes: 1 << 30,
                    cpu_millis: 1000,
                    pids: 64,
                    scratch_bytes: 1 << 20,
                    shm_bytes: 1 << 20,
                },
                network: false,
                escrow: EscrowId(escrow),
                escrow_amount: amount,
                bid: None,
                ssh_keys: gpux_protocol::BoundedVec::empty(),
                terms: gpux_protocol::LeaseTerms::default(),
                ext: Ext::new(),
            },
        )?)
    }

    /// A host's booking changed: renters see it a gossip delay later, through a publication.
    fn booking_changed(&mut self, h: usize) {
        let now = Timestamp(self.now);
        let host = &mut self.hosts[h];
        let busy = host.book.busy_gpus(now);
        let mask = host
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| busy.contains(g))
            .fold(0u8, |m, (i, _)| m | (1 << i));
        host.busy.push((self.now - T0, mask));
        if host.busy.len() > 16 {
            host.busy.drain(..8);
        }
        let all_busy = mask.count_ones() as usize == host.gpus.len();
        let p = &mut self.figures.per_family[host.family].publications;
        p.on_change += 1;
        if all_busy {
            p.withdrawals += 1;
        }
    }
}

/// A host's offer: all its GPUs, of its family, valid past the end of the run.
fn offer_body(gpus: &[GpuUuid], family: usize, duration_ms: u64) -> anyhow::Result<Offer> {
    let info = gpux_protocol::family::FAMILIES.get(family);
    let vram = info
        .and_then(|f| f.nominal_vram_gb.first())
        .copied()
        .unwrap_or(24);
    Ok(Offer {
        seq: 1,
        slot: 0,
        created_at: Timestamp(T0),
        expires_at: Timestamp(T0 + duration_ms + 3_600_000),
        attestation: ContentId([7; 32]),
        gpus: BoundedVec::new(
            gpus.iter()
                .map(|uuid| OfferGpu {
                    uuid: *uuid,
                    family: BoundedString::new(family_key(family)).unwrap_or_default(),
                    memory_bytes: u64::from(vram) * 1_000_000_000,
                    compute_capability: info
                        .map_or(ComputeCapability::new(8, 0), |f| f.compute_capability),
                    pcie_gen: 4,
                })
                .collect(),
        )?,
        price_per_gpu_hour: PRICE,
        spot_floor_per_gpu_hour: None,
        min_duration_s: 60,
        max_duration_s: 86_400,
        region: BoundedString::new("eu").unwrap_or_default(),
        tier: EvidenceTier::SelfReported,
        driver: Version::default(),
        cuda: Version::default(),
        images: BoundedVec::new(vec![ImageDigest([4; 32])])?,
        machine: gpux_protocol::Machine::split_evenly("test CPU", 16, 64 << 30, 16),
        pulls: gpux_protocol::Pulls::default(),
        terms: gpux_protocol::OfferTerms::default(),
        ext: Ext::new(),
    })
}

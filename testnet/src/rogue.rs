//! The rogue-peer kit: a peer on real libp2p that attacks a market the way the
//! under-attack tests and benchmarks need. It runs the node's own swarm (so it speaks
//! every protocol correctly) but none of its rules: it publishes what it likes.
//!
//! - [`Rogue::fake_hosts`]: fresh host keys, each with a plausible self-signed attestation
//!   and a cheap offer, that nobody can dial (the keys have no node behind them);
//! - [`Rogue::publish`]: any bytes on any topic (forged tiers, garbage, replays).
//!
//! It answers every gossip message it receives with `Ignore`, so it forwards nothing.

use std::time::Duration;

use anyhow::Context;
use gpux_node::p2p::{self, Client, MessageAcceptance, NetConfig, NetworkEvent, topics};
use gpux_protocol::{
    Attestation, BoundedString, BoundedVec, ComputeCapability, ContentId, EvidenceTier, Ext,
    GpuFacts, GpuUuid, ImageDigest, Keypair, MicroCredits, Offer, OfferGpu, PcieFacts, Signed,
    Timestamp, Version,
};

/// A rogue peer.
#[derive(Debug)]
pub struct Rogue {
    client: Client,
    /// What it has published.
    pub published: u64,
    seed: [u8; 32],
    made: u64,
    /// Publications that failed (the rogue cut off).
    pub failed: u64,
}

/// The fake L4 every fake host claims (what the fake NVML driver reports for one).
const L4_NAME: &str = "NVIDIA L4";
const L4_MEMORY: u64 = 24_152_899_584;

impl Rogue {
    /// Starts a rogue peer on loopback and connects it to `peer` (with `/p2p/<id>`).
    pub async fn start(peer: &str) -> anyhow::Result<Rogue> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| anyhow::anyhow!("random: {e}"))?;
        let key = Keypair::from_seed(&seed);
        let config = NetConfig {
            listen: vec!["/ip4/127.0.0.1/tcp/0".parse()?],
            kademlia: false,
            heartbeat: Duration::from_millis(300),
            ..NetConfig::default()
        };
        let (client, mut events) = p2p::spawn(&key, config).await?;
        let handle = client.clone();
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                if let NetworkEvent::Gossip { id, source, .. } = event {
                    handle.report_nowait(id, source, MessageAcceptance::Ignore);
                }
            }
        });
        client
            .dial(peer.parse().context("the peer's address")?)
            .await
            .context("the rogue dialling its victim")?;
        Ok(Rogue {
            client,
            published: 0,
            seed,
            made: 0,
            failed: 0,
        })
    }

    /// Waits until the victim has a gossip mesh with the rogue on the L4 attestation
    /// and offer topics (publishing before that reaches nobody).
    pub async fn wait_for_mesh(&self, timeout: Duration) -> anyhow::Result<()> {
        let start = std::time::Instant::now();
        let l4 = topics::offers("l4").to_string();
        loop {
            let a = self
                .client
                .mesh_peers(topics::attestations("l4").to_string())
                .await?;
            let o = self.client.mesh_peers(l4.clone()).await?;
            if !a.is_empty() && !o.is_empty() {
                return Ok(());
            }
            if start.elapsed() > timeout {
                anyhow::bail!("no gossip mesh with the victim after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The rogue's peer id.
    pub fn peer_id(&self) -> gpux_node::p2p::PeerId {
        self.client.local_peer_id()
    }

    /// Sends `data` as a request on `proto` to `peer` (a peer id the rogue is connected to)
    /// and returns the answer: for malformed frames on the request-response protocols.
    pub async fn request(
        &self,
        proto: gpux_node::p2p::Proto,
        peer: &str,
        data: Vec<u8>,
    ) -> anyhow::Result<Vec<u8>> {
        let peer: gpux_node::p2p::PeerId = peer.parse().context("the peer id")?;
        Ok(self.client.request_on(proto, peer, data).await?)
    }

    /// Opens a workload-plane stream on `protocol` to `peer`, to speak its frames by hand.
    pub async fn plane_stream(
        &self,
        peer: &str,
        protocol: &'static str,
    ) -> anyhow::Result<PlaneStream> {
        let peer: gpux_node::p2p::PeerId = peer.parse().context("the peer id")?;
        let stream = self
            .client
            .open_stream(
                peer,
                gpux_node::p2p::StreamProtocol::new(protocol),
                Duration::from_secs(10),
            )
            .await?;
        Ok(PlaneStream(stream))
    }

    /// Opens a workload-plane stream (`/gpux/exec/1`, `/gpux/forward/1`) to `peer`, sends
    /// `open` (one frame, length-prefixed) and returns the host's answer: for trying another
    /// renter's lease.
    pub async fn plane_open(
        &self,
        peer: &str,
        protocol: &'static str,
        open: Vec<u8>,
    ) -> anyhow::Result<gpux_protocol::plane_wire::Opened> {
        use futures::{AsyncReadExt, AsyncWriteExt};
        let peer: gpux_node::p2p::PeerId = peer.parse().context("the peer id")?;
        let mut stream = self
            .client
            .open_stream(
                peer,
                gpux_node::p2p::StreamProtocol::new(protocol),
                Duration::from_secs(10),
            )
            .await?;
        let len = u32::try_from(open.len()).context("a frame that large")?;
        stream.write_all(&len.to_be_bytes()).await?;
        stream.write_all(&open).await?;
        stream.flush().await?;
        let mut len = [0u8; 4];
        stream.read_exact(&mut len).await?;
        let mut frame = vec![0u8; u32::from_be_bytes(len) as usize];
        anyhow::ensure!(
            frame.len() <= gpux_protocol::plane_wire::MAX_PLANE_FRAME,
            "an oversized answer"
        );
        stream.read_exact(&mut frame).await?;
        Ok(gpux_protocol::plane_wire::decode(&frame)?)
    }

    /// Publishes `data` on `topic`.
    pub async fn publish(&mut self, topic: &str, data: Vec<u8>) -> anyhow::Result<()> {
        self.client.publish(topic.to_string(), data).await?;
        self.published += 1;
        Ok(())
    }

    /// A fresh host key.
    pub fn fresh_key(&mut self) -> Keypair {
        self.made += 1;
        let mut hasher = blake3::Hasher::new();
        hasher.update(&self.seed);
        hasher.update(&self.made.to_be_bytes());
        Keypair::from_seed(hasher.finalize().as_bytes())
    }

    /// Floods: `keys_per_min` fake hosts a minute (see [`Rogue::fake_hosts`]) for
    /// `duration`, in batches every 100 ms, carrying on when publishing fails (a cut-off
    /// rogue keeps trying, as an attacker would). Returns the keys published and those whose
    /// publication failed.
    pub async fn flood(
        &mut self,
        keys_per_min: u32,
        duration: Duration,
        price: MicroCredits,
        image: ImageDigest,
    ) -> (u64, u64) {
        let start = tokio::time::Instant::now();
        let failed_before = self.failed;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let per_tick = f64::from(keys_per_min) / 600.0;
        let (mut owed, mut sent) = (0.0, 0u64);
        while start.elapsed() < duration {
            tick.tick().await;
            owed += per_tick;
            let n = owed.floor() as usize;
            owed -= n as f64;
            for _ in 0..n {
                let key = self.fresh_key();
                let Ok((attestation, offer)) =
                    fake_host(&key, price, image, EvidenceTier::SelfReported, now())
                else {
                    continue;
                };
                let a = self
                    .publish(&topics::attestations("l4").to_string(), attestation)
                    .await;
                let o = self.publish(&topics::offers("l4").to_string(), offer).await;
                match (a, o) {
                    (Ok(()), Ok(())) => sent += 1,
                    (Err(e), _) | (_, Err(e)) => {
                        self.failed += 1;
                        tracing_free_note(self.failed, &e);
                    }
                }
            }
        }
        (sent, self.failed - failed_before)
    }

    /// `n` fake hosts: fresh keys, each with a plausible attestation of one L4 and an offer of
    /// it at `price` listing `image`, claiming `tier`. Returns their keys.
    pub async fn fake_hosts(
        &mut self,
        n: usize,
        price: MicroCredits,
        image: ImageDigest,
        tier: EvidenceTier,
    ) -> anyhow::Result<Vec<Keypair>> {
        let mut keys = Vec::with_capacity(n);
        for _ in 0..n {
            let key = self.fresh_key();
            let (attestation, offer) = fake_host(&key, price, image, tier, now())?;
            self.publish(&topics::attestations("l4").to_string(), attestation)
                .await?;
            self.publish(&topics::offers("l4").to_string(), offer)
                .await?;
            keys.push(key);
        }
        Ok(keys)
    }
}

/// Says now and then why the rogue's publications fail (it has been cut off).
fn tracing_free_note(failed: u64, e: &anyhow::Error) {
    if failed % 1000 == 1 {
        eprintln!("rogue: publishing failed ({failed} so far): {e:#}");
    }
}

fn now() -> Timestamp {
    gpux_node::attest::now()
}

/// One fake host's signed attestation and offer (envelopes), made at `at`.
pub fn fake_host(
    key: &Keypair,
    price: MicroCredits,
    image: ImageDigest,
    tier: EvidenceTier,
    at: Timestamp,
) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let id = ContentId::of(&key.peer_id().to_bytes());
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&id.0[..16]);
    let uuid = GpuUuid::Gpu(uuid);
    let gpu = GpuFacts {
        index: 0,
        name: BoundedString::new(L4_NAME)?,
        uuid,
        serial: None,
        board_part_number: None,
        memory_total_bytes: L4_MEMORY,
        compute_capability: ComputeCapability::new(8, 9),
        pcie: PcieFacts::default(),
        power_limit_mw: None,
        max_sm_clock_mhz: None,
        max_memory_clock_mhz: None,
        ecc: None,
        mig: None,
        confidential_compute: None,
    };
    let attestation = Signed::sign(
        key,
        Attestation {
            created_at: at,
            driver_version: BoundedString::new("550.54.15")?,
            cuda_driver_version: None,
            nvml_version: BoundedString::new("12.550.54.15")?,
            gpus: BoundedVec::new(vec![gpu])?,
            ext: Ext::new(),
        },
    )?;
    let offer = Signed::sign(
        key,
        Offer {
            seq: at.0,
            slot: 0,
            created_at: at,
            expires_at: at.plus_secs(600),
            attestation: attestation.id(),
            gpus: BoundedVec::new(vec![OfferGpu {
                uuid,
                family: BoundedString::new("l4")?,
                memory_bytes: L4_MEMORY,
                compute_capability: ComputeCapability::new(8, 9),
                pcie_gen: 0,
            }])?,
            price_per_gpu_hour: price,
            spot_floor_per_gpu_hour: None,
            min_duration_s: 60,
            max_duration_s: 86_400,
            region: BoundedString::new("any")?,
            tier,
            driver: Version::new(550, 54, 15),
            cuda: Version::new(12, 4, 0),
            images: BoundedVec::new(vec![image])?,
            machine: gpux_protocol::Machine::split_evenly("test CPU", 16, 64 << 30, 16),
            pulls: gpux_protocol::Pulls::default(),
            terms: gpux_protocol::OfferTerms::default(),
            ext: Ext::new(),
        },
    )?;
    Ok((attestation.as_bytes().to_vec(), offer.as_bytes().to_vec()))
}

/// A workload-plane stream a rogue speaks by hand: frames length-prefixed (4 bytes, big
/// endian), as the plane's protocols have them.
pub struct PlaneStream(gpux_node::p2p::Stream);

impl PlaneStream {
    /// Sends one frame (`plane_wire::encode`'s bytes).
    pub async fn send(&mut self, frame: &[u8]) -> anyhow::Result<()> {
        use futures::AsyncWriteExt;
        let len = u32::try_from(frame.len()).context("a frame that large")?;
        self.0.write_all(&len.to_be_bytes()).await?;
        self.0.write_all(frame).await?;
        self.0.flush().await?;
        Ok(())
    }

    /// Receives one frame (for `plane_wire::decode`).
    pub async fn recv(&mut self) -> anyhow::Result<Vec<u8>> {
        use futures::AsyncReadExt;
        let mut len = [0u8; 4];
        self.0.read_exact(&mut len).await?;
        let mut frame = vec![0u8; u32::from_be_bytes(len) as usize];
        anyhow::ensure!(
            frame.len() <= gpux_protocol::plane_wire::MAX_PLANE_FRAME,
            "an oversized frame"
        );
        self.0.read_exact(&mut frame).await?;
        Ok(frame)
    }
}

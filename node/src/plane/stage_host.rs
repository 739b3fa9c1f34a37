//! The host's side of staging (`/gpux/stage/1`): it plans by chain, takes the config and
//! the layers it lacks (blake3-checked, kept across a dropped connection), writes the load
//! manifest itself (no tags: a renter never re-points a host's tag), loads the image,
//! checks its id, and holds it for that renter only (`super::staged`).
//!
//! Bounds: [`MAX_STAGINGS`] at once, one per renter, [`STARTS_BURST`] starts per renter and
//! then one a minute, the host's largest image, its staging quota (kept images and arriving
//! bytes together), [`MAX_HOLDS`] images held, and a deadline for the bytes to arrive (two
//! minutes plus a second per MiB). Interrupted stagings' bytes are dropped after
//! [`PART_TTL`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use gpux_protocol::plane_wire::{
    MAX_STAGE_CONFIG, Opened, PlaneRefusal, StageData, StageDone, StageNeed, StageOpen, StagePlan,
};
use gpux_protocol::{BoundedVec, PublicKey};
use libp2p::PeerId;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::stage::{STAGE, chain_ids, diff_ids, image_id};
use super::stage_pace::{DATA_DEADLINE, Failed, MIN_RATE, Pace};
use super::staged::{Hold, StagedImages, UNUSED_TTL_MS};
use super::turns::{Turn, Turns};
use super::{FramedStream, OPEN_WITHIN, framed, recv, send};
use crate::attest::now;
use crate::executor::Executor;
use crate::p2p::Client;
use gpux_lease::{
    LayerOnDisk, LayerStored, StageCheck, StageInput, StageLayerSpec, StageNext, StageSide,
    StageStep,
};

/// Stagings served at once, all renters together.
pub(crate) const MAX_STAGINGS: usize = 4;
/// How long an interrupted staging's bytes wait for the renter to come back.
pub(crate) const PART_TTL: Duration = Duration::from_secs(3600);
/// Staged-image holds kept at most (each is a renter's image in Docker).
pub(crate) const MAX_HOLDS: usize = 1024;
/// How often expired images and stale bytes are erased.
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// The host's staging service.
#[derive(Clone)]
pub(crate) struct StageHost {
    exec: Executor,
    staged: StagedImages,
    /// Where arriving layers wait: `<root>/parts/<renter>/<image>/`.
    root: PathBuf,
    max_image_bytes: u64,
    quota_bytes: u64,
    turns: Turns,
    /// Bytes the stagings under way may still bring, counted against the quota before they
    /// arrive, so that stagings at once cannot together pass it.
    reserved: Arc<Mutex<u64>>,
}

/// Bytes a staging may still bring, reserved against the quota; given back when dropped.
struct Reservation {
    bytes: u64,
    reserved: Arc<Mutex<u64>>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut reserved = self.reserved.lock().unwrap_or_else(|p| p.into_inner());
        *reserved = reserved.saturating_sub(self.bytes);
    }
}

type Refusal = (PlaneRefusal, String);

impl StageHost {
    /// Takes `/gpux/stage/1` on `net` (when the host stages renter images at all) and
    /// sweeps expired images and stale bytes until the network stops.
    pub(crate) fn spawn(
        net: &Client,
        exec: Executor,
        staged: StagedImages,
        root: PathBuf,
        max_image_bytes: u64,
        quota_bytes: u64,
    ) -> anyhow::Result<()> {
        let host = StageHost {
            exec,
            staged,
            root,
            max_image_bytes,
            quota_bytes,
            turns: Turns::new(MAX_STAGINGS),
            reserved: Arc::new(Mutex::new(0)),
        };
        let mut streams = net.accept_streams(STAGE)?;
        let h = host.clone();
        tokio::spawn(async move {
            while let Some((peer, stream)) = streams.next().await {
                let h = h.clone();
                tokio::spawn(async move { h.serve(peer, framed(stream)).await });
            }
        });
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            loop {
                tick.tick().await;
                host.staged.erase_expired(&host.exec).await;
                let parts = host.root.join("parts");
                let _ = tokio::task::spawn_blocking(move || remove_stale(&parts, PART_TTL)).await;
            }
        });
        Ok(())
    }

    async fn refuse(framed: &mut FramedStream, (code, detail): Refusal) {
        tracing::debug!("staging refused: {detail}");
        let _ = send(framed, &Opened::refused(code, &detail)).await;
        let _ = SinkExt::<Bytes>::close(framed).await;
    }

    /// Checks the open frame against the host's policy and the renter's bounds; takes a
    /// staging turn.
    fn admit(&self, renter: PublicKey, open: &StageOpen) -> Result<Turn, Refusal> {
        let malformed = |d: String| (PlaneRefusal::Malformed, d);
        if self.max_image_bytes == 0 {
            return Err((
                PlaneRefusal::Unavailable,
                "this host runs only the images it lists".into(),
            ));
        }
        if open.layers.is_empty() {
            return Err(malformed("an image has at least one layer".into()));
        }
        if open.config_bytes == 0 || open.config_bytes > MAX_STAGE_CONFIG {
            return Err(malformed(format!(
                "an image config has 1 to {MAX_STAGE_CONFIG} bytes"
            )));
        }
        let total = open
            .layers
            .iter()
            .try_fold(u64::from(open.config_bytes), |t, l| t.checked_add(l.bytes))
            .unwrap_or(u64::MAX);
        if total > self.max_image_bytes {
            return Err((
                PlaneRefusal::Unavailable,
                format!(
                    "the image has {total} bytes; this host stages images up to {}",
                    self.max_image_bytes
                ),
            ));
        }
        let busy = |d: &str| (PlaneRefusal::Busy, d.to_string());
        if !self.staged.held(&open.image, &renter) && !self.staged.make_room(MAX_HOLDS) {
            return Err(busy(
                "this host holds as many staged images as it keeps, all in use; try later",
            ));
        }
        self.turns.take(renter, "staging")
    }

    async fn serve(self, peer: PeerId, mut framed: FramedStream) {
        let open: StageOpen = match recv(&mut framed, OPEN_WITHIN).await {
            Ok(open) => open,
            Err(e) => {
                let refusal = (PlaneRefusal::Malformed, format!("the open frame: {e}"));
                return Self::refuse(&mut framed, refusal).await;
            }
        };
        let Ok(renter) = peer
            .to_string()
            .parse::<gpux_protocol::PeerId>()
            .map(|p| p.public_key())
        else {
            let refusal = (
                PlaneRefusal::Malformed,
                "only ed25519 peers rent here".to_string(),
            );
            return Self::refuse(&mut framed, refusal).await;
        };
        let _turn = match self.admit(renter, &open) {
            Ok(turn) => turn,
            Err(refusal) => return Self::refuse(&mut framed, refusal).await,
        };
        let image = open.image;
        match self.stage(&mut framed, renter, &open).await {
            Ok(Some(())) => {
                tracing::info!("staged image {image} for {}", renter.peer_id());
                let _ = send(&mut framed, &StageDone::Loaded).await;
            }
            Ok(None) => {}
            Err(Failed(why)) => {
                tracing::info!("staging image {image} failed: {why}");
                let _ = send(&mut framed, &StageDone::failed(&why)).await;
            }
        }
        let _ = SinkExt::<Bytes>::close(&mut framed).await;
    }

    /// Plans, receives and loads; `Ok(None)` when it refused (and said so).
    async fn stage(
        &self,
        framed: &mut FramedStream,
        renter: PublicKey,
        open: &StageOpen,
    ) -> Result<Option<()>, Failed> {
        let image = open.image;
        let present = self.exec.diff_ids(&image).await?.is_some();
        if present && self.staged.held(&image, &renter) {
            // Held for this renter already (cached, or staged moments ago): nothing to send.
            send(framed, &Opened::Yes).await?;
            let plan = StagePlan {
                config: false,
                layers: BoundedVec::new(Vec::new())?,
            };
            send(framed, &plan).await?;
            self.staged.add(self.hold(open, renter, present));
            return Ok(Some(()));
        }
        let declared: Vec<[u8; 32]> = open.layers.iter().map(|l| l.diff_id).collect();
        let have = self
            .exec
            .layer_chains(&self.staged.foreign(&renter))
            .await?;
        let chains = chain_ids(&declared);
        // Layers in the store only through another renter's image: `docker load` will skip
        // them unread, so this host checks their sha256 itself (a renter proves it has the
        // bytes, not just the ids).
        let foreign = self.staged.foreign(&renter);
        let stored = if foreign.is_empty() {
            have.clone()
        } else {
            self.exec.layer_chains(&BTreeSet::new()).await?
        };
        let dir = self
            .root
            .join("parts")
            .join(gpux_protocol::hex(&renter.0))
            .join(gpux_protocol::hex(&image.0));
        // Where each layer is: in the store (with its chain), and what an earlier staging
        // left of it on disk.
        let mut found = Vec::new();
        for (i, layer) in open.layers.iter().enumerate() {
            let in_store = if have.contains(&chains[i]) {
                LayerStored::Yes
            } else if stored.contains(&chains[i]) {
                LayerStored::Foreign
            } else {
                LayerStored::No
            };
            let name = gpux_protocol::hex(&layer.diff_id);
            let whole = tokio::fs::metadata(dir.join(format!("{name}.tar"))).await;
            let on_disk = if whole.is_ok_and(|m| m.len() == layer.bytes) {
                LayerOnDisk::Whole
            } else {
                match tokio::fs::metadata(dir.join(format!("{name}.part"))).await {
                    Ok(m) => LayerOnDisk::Part(m.len()),
                    Err(_) => LayerOnDisk::Nothing,
                }
            };
            found.push((in_store, on_disk));
        }
        let specs = open
            .layers
            .iter()
            .map(|l| StageLayerSpec {
                diff_id: l.diff_id,
                blake3: l.blake3,
                bytes: l.bytes,
            })
            .collect();
        let (mut check, _) = StageCheck::new(image.0, specs, &found);
        let needs: Vec<StageNeed> = check
            .needs()
            .into_iter()
            .map(|(index, from)| StageNeed {
                index: index as u16,
                from,
            })
            .collect();
        let incoming = u64::from(open.config_bytes) + check.incoming_bytes();
        let on_disk = self.staged.bytes() + dir_bytes(self.root.join("parts")).await;
        let _reservation = match self.reserve(on_disk, incoming) {
            Ok(reservation) => reservation,
            Err(used) => {
                let detail = format!(
                    "this host's staging quota is full ({used} of {} bytes used or on their way); \
                 try later",
                    self.quota_bytes
                );
                Self::refuse(framed, (PlaneRefusal::Busy, detail)).await;
                return Ok(None);
            }
        };
        tokio::fs::create_dir_all(&dir).await?;
        send(framed, &Opened::Yes).await?;
        send(
            framed,
            &StagePlan {
                config: true,
                layers: BoundedVec::new(needs.clone())?,
            },
        )
        .await?;
        let mut pace = Pace::new();
        let config = receive_config(framed, open.config_bytes, &mut pace).await?;
        let step = check.handle(StageInput::Config {
            id: image_id(&config).0,
            diff_ids: diff_ids(&config)?,
        });
        if let StageNext::Done(Err(why)) = step.next {
            return Err(Failed(why));
        }
        let deadline = DATA_DEADLINE + Duration::from_secs(incoming / MIN_RATE);
        tokio::time::timeout(
            deadline,
            self.receive_and_load(framed, &mut pace, &dir, &config, open, (check, step)),
        )
        .await
        .map_err(|_| {
            Failed(format!(
                "the image did not arrive within {} s (at least 1 MiB/s is needed)",
                deadline.as_secs()
            ))
        })??;
        let host_image = present && !self.staged.any_hold(&image);
        self.staged.add(self.hold(open, renter, host_image));
        let _ = tokio::fs::remove_dir_all(&dir).await;
        Ok(Some(()))
    }

    /// Reserves `incoming` bytes against the quota, `on_disk` being used already; `Err`
    /// with the bytes used when they do not fit. What other stagings under way have
    /// received is on disk and reserved both: counted twice, never missed.
    fn reserve(&self, on_disk: u64, incoming: u64) -> Result<Reservation, u64> {
        let mut reserved = self.reserved.lock().unwrap_or_else(|p| p.into_inner());
        let used = on_disk.saturating_add(*reserved);
        if used.saturating_add(incoming) > self.quota_bytes {
            return Err(used);
        }
        *reserved += incoming;
        Ok(Reservation {
            bytes: incoming,
            reserved: self.reserved.clone(),
        })
    }

    fn hold(&self, open: &StageOpen, renter: PublicKey, host_image: bool) -> Hold {
        Hold {
            image: open.image,
            renter,
            bytes: u64::from(open.config_bytes) + open.layers.iter().map(|l| l.bytes).sum::<u64>(),
            leases: BTreeMap::new(),
            until_ms: now().0 + UNUSED_TTL_MS,
            host_image,
        }
    }

    /// `docker load` of a tar written here as the layers arrive, so the transfer and the
    /// daemon's unpacking overlap: the manifest (no tags), the config, and the layers
    /// [`StageCheck`] loads (the others are in the layer store with their chains already),
    /// each either from its verified file or from what an earlier staging left plus the
    /// bytes arriving now. Arriving bytes are also kept in the layer's part file, so a
    /// broken staging goes on from them. The machine checks each layer's digests as it is
    /// written and completes the tar only when every one verified, so nothing unverified
    /// is ever loaded.
    async fn receive_and_load(
        &self,
        framed: &mut FramedStream,
        pace: &mut Pace,
        dir: &Path,
        config: &[u8],
        open: &StageOpen,
        (mut check, mut step): (StageCheck, StageStep),
    ) -> Result<(), Failed> {
        let names: Vec<String> = open
            .layers
            .iter()
            .map(|l| format!("layers/{}.tar", gpux_protocol::hex(&l.diff_id)))
            .collect();
        let manifest = serde_json::to_vec(&serde_json::json!([{
            "Config": "config.json",
            "RepoTags": null,
            "Layers": names,
        }]))?;
        let tar = LoadTar::start(&self.exec);
        let file_of = |i: usize, ext: &str| {
            dir.join(format!(
                "{}.{ext}",
                gpux_protocol::hex(&open.layers[i].diff_id)
            ))
        };
        let written = async {
            tar.file("manifest.json", Bytes::from(manifest)).await?;
            tar.file("config.json", Bytes::copy_from_slice(config))
                .await?;
            loop {
                for side in &step.side {
                    match *side {
                        StageSide::Keep(i) => {
                            tokio::fs::rename(file_of(i, "part"), file_of(i, "tar")).await?
                        }
                        StageSide::Drop(i) => {
                            let _ = tokio::fs::remove_file(file_of(i, "part")).await;
                        }
                    }
                }
                let input = match step.next {
                    StageNext::Layer {
                        index,
                        from,
                        sha256,
                    } => {
                        let layer = open.layers[index];
                        tar.header(&names[index], layer.bytes).await?;
                        let sha = sha256.then(Sha256::new);
                        let (blake3, sha) = match from {
                            Some(from) => {
                                let part = file_of(index, "part");
                                let (blake3, sha) = receive_layer(
                                    framed,
                                    pace,
                                    (&part, layer.bytes, from),
                                    &tar,
                                    sha,
                                )
                                .await?;
                                (Some(blake3), sha)
                            }
                            None => {
                                let whole = file_of(index, "tar");
                                (None, tar.copy_file(&whole, layer.bytes, sha).await?)
                            }
                        };
                        tar.pad(layer.bytes).await?;
                        StageInput::Layer {
                            blake3,
                            sha256: sha.map(|sha| sha.finalize().into()),
                        }
                    }
                    StageNext::Finish => return Ok(true),
                    StageNext::Done(Err(why)) => return Err(Failed(why)),
                    StageNext::Config | StageNext::Done(Ok(())) => return Ok(false),
                };
                step = check.handle(input);
            }
        }
        .await;
        match written {
            Ok(true) => tar.finish().await?,
            Ok(false) => {
                return Err(tar.abort(Failed("the staging lost its place".into())).await);
            }
            Err(why) => return Err(tar.abort(why).await),
        }
        let present = self.exec.diff_ids(&open.image).await?.is_some();
        match check.handle(StageInput::Loaded(present)).next {
            StageNext::Done(Ok(())) => Ok(()),
            StageNext::Done(Err(why)) => Err(Failed(why)),
            _ => Err(Failed("the staging lost its place".into())),
        }
    }
}

/// The tar `docker load` reads, written as it goes (headers, data, padding), into the
/// daemon's request body. Dropped unfinished (a deadline passed), it cuts the request off
/// mid-body, which the daemon refuses: a tar is only ever complete when every layer in it
/// verified.
struct LoadTar {
    tx: Option<tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>>,
    task: Option<tokio::task::JoinHandle<Result<(), crate::executor::ExecError>>>,
}

impl Drop for LoadTar {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl LoadTar {
    /// Starts `docker load` reading from this tar.
    fn start(exec: &Executor) -> Self {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let exec = exec.clone();
        let task = tokio::spawn(async move { exec.load_image(stream_of(rx)).await });
        Self {
            tx: Some(tx),
            task: Some(task),
        }
    }

    async fn push(&self, bytes: Bytes) -> Result<(), Failed> {
        let stopped = || Failed("docker load stopped reading".into());
        self.tx
            .as_ref()
            .ok_or_else(stopped)?
            .send(Ok(bytes))
            .await
            .map_err(|_| stopped())
    }

    async fn header(&self, name: &str, size: u64) -> Result<(), Failed> {
        let mut header = tar::Header::new_gnu();
        header.set_path(name)?;
        header.set_size(size);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        self.push(Bytes::copy_from_slice(header.as_bytes())).await
    }

    /// Zeros up to the next 512-byte block after `size` bytes of data.
    async fn pad(&self, size: u64) -> Result<(), Failed> {
        let pad = (512 - size % 512) % 512;
        if pad > 0 {
            self.push(Bytes::from(vec![0u8; pad as usize])).await?;
        }
        Ok(())
    }

    async fn file(&self, name: &str, data: Bytes) -> Result<(), Failed> {
        let size = data.len() as u64;
        self.header(name, size).await?;
        self.push(data).await?;
        self.pad(size).await
    }

    /// `size` bytes of the file at `path` (hashed into `sha`, when given).
    async fn copy_file(
        &self,
        path: &Path,
        size: u64,
        mut sha: Option<Sha256>,
    ) -> Result<Option<Sha256>, Failed> {
        let mut file = tokio::fs::File::open(path).await?;
        let mut left = size;
        while left > 0 {
            let mut chunk = vec![0u8; left.min(1 << 20) as usize];
            tokio::io::AsyncReadExt::read_exact(&mut file, &mut chunk).await?;
            left -= chunk.len() as u64;
            if let Some(sha) = &mut sha {
                sha.update(&chunk);
            }
            self.push(Bytes::from(chunk)).await?;
        }
        Ok(sha)
    }

    /// Waits for the load, once the sender is gone (finished, or failed).
    async fn outcome(&mut self) -> Result<(), Failed> {
        self.tx = None;
        match self.task.take() {
            Some(task) => match task.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(Failed(format!("docker load: {e}"))),
                Err(e) => Err(Failed(e.to_string())),
            },
            None => Err(Failed("the load was not started".into())),
        }
    }

    /// Ends the tar and waits for the load.
    async fn finish(mut self) -> Result<(), Failed> {
        let ended = self.push(Bytes::from(vec![0u8; 1024])).await;
        // The daemon's own error says more than "it stopped reading".
        match (self.outcome().await, ended) {
            (Err(e), _) => Err(e),
            (Ok(()), ended) => ended,
        }
    }

    /// Ends the load unfinished (the daemon discards it); says why, with the daemon's
    /// own error when it stopped first.
    async fn abort(mut self, why: Failed) -> Failed {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Err(std::io::Error::other(why.0.clone()))).await;
        }
        match self.outcome().await {
            Err(e) if why.0.contains("docker load stopped") => e,
            _ => why,
        }
    }
}

fn stream_of(
    mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

async fn receive_config(
    framed: &mut FramedStream,
    size: u32,
    pace: &mut Pace,
) -> Result<Vec<u8>, Failed> {
    let mut config = Vec::with_capacity(size as usize);
    while config.len() < size as usize {
        let StageData(data) = pace.recv(framed).await?;
        if config.len() + data.len() > size as usize {
            return Err(Failed("more config bytes than announced".into()));
        }
        config.extend_from_slice(&data);
    }
    Ok(config)
}

/// Receives a layer of `bytes` from byte `from` into its part file and on into the load
/// tar (what an earlier staging left first); returns its blake3 over the whole layer (and
/// its sha256, when `sha` is given), for [`StageCheck`] to check. Bytes that arrived stay
/// for a retry when the stream breaks.
async fn receive_layer(
    framed: &mut FramedStream,
    pace: &mut Pace,
    (part, bytes, from): (&Path, u64, u64),
    tar: &LoadTar,
    mut sha: Option<Sha256>,
) -> Result<([u8; 32], Option<Sha256>), Failed> {
    let mut hasher = blake3::Hasher::new();
    let mut file = tokio::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .write(true)
        .truncate(false)
        .open(part)
        .await?;
    file.set_len(from).await?;
    let mut left = from;
    while left > 0 {
        let mut chunk = vec![0u8; left.min(1 << 20) as usize];
        tokio::io::AsyncReadExt::read_exact(&mut file, &mut chunk).await?;
        left -= chunk.len() as u64;
        hasher.update(&chunk);
        if let Some(sha) = &mut sha {
            sha.update(&chunk);
        }
        tar.push(Bytes::from(chunk)).await?;
    }
    let mut file = tokio::io::BufWriter::with_capacity(1 << 20, file);
    let mut left = bytes - from;
    let mut result = Ok(());
    while left > 0 {
        let StageData(data) = match pace.recv(framed).await {
            Ok(d) => d,
            Err(e) => {
                result = Err(e);
                break;
            }
        };
        if data.len() as u64 > left {
            result = Err(Failed("more layer bytes than announced".into()));
            break;
        }
        file.write_all(&data).await?;
        hasher.update(&data);
        if let Some(sha) = &mut sha {
            sha.update(&data[..]);
        }
        left -= data.len() as u64;
        let data = Bytes::from(data.into_inner());
        if let Err(e) = tar.push(data).await {
            result = Err(e);
            break;
        }
    }
    file.flush().await?;
    result?;
    Ok((*hasher.finalize().as_bytes(), sha))
}

/// Bytes of the files under `dir`.
async fn dir_bytes(dir: PathBuf) -> u64 {
    tokio::task::spawn_blocking(move || {
        fn walk(dir: &Path) -> u64 {
            std::fs::read_dir(dir)
                .map(|entries| {
                    entries
                        .flatten()
                        .map(|e| match e.file_type() {
                            Ok(t) if t.is_dir() => walk(&e.path()),
                            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
                            _ => 0,
                        })
                        .sum()
                })
                .unwrap_or(0)
        }
        walk(&dir)
    })
    .await
    .unwrap_or(0)
}

/// Removes the image directories under `<parts>/<renter>/` not written to for `ttl`.
fn remove_stale(parts: &Path, ttl: Duration) {
    let Ok(renters) = std::fs::read_dir(parts) else {
        return;
    };
    for renter in renters.flatten() {
        let Ok(images) = std::fs::read_dir(renter.path()) else {
            continue;
        };
        for image in images.flatten() {
            let newest = std::fs::read_dir(image.path())
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|f| f.metadata().ok()?.modified().ok())
                .chain(image.metadata().ok().and_then(|m| m.modified().ok()))
                .max();
            if newest.is_some_and(|t| t.elapsed().unwrap_or_default() > ttl) {
                let _ = std::fs::remove_dir_all(image.path());
            }
        }
        let _ = std::fs::remove_dir(renter.path());
    }
}

//! Staging a renter's own image on a host, before any GPU is booked (`/gpux/stage/1`).
//!
//! The renter's node reads a `docker save` archive ([`Archive`]: from the renter's Docker,
//! or a file), tells the host the image id and each layer's diff id, size and blake3, and
//! sends the config and the layers the host's plan asks for. The host plans by **chain**:
//! `docker load` skips a layer only when the layer and its whole chain of parents are in
//! its layer store, so a layer is left out exactly when the chain up to it is one the host
//! has. The host then writes the load manifest itself (no tags), loads, and checks the
//! image id; `stage_host` is its side, [`stage_image`] the renter's.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, bail};
use futures::{SinkExt, StreamExt};
use gpux_protocol::plane_wire::{
    self, MAX_FILE_DATA, MAX_STAGE_CONFIG, MAX_STAGE_LAYERS, Opened, StageData, StageDone,
    StageLayer, StageOpen, StagePlan,
};
use gpux_protocol::{BoundedBytes, BoundedVec, ImageDigest};
use libp2p::{PeerId, StreamProtocol};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::{OPEN_WITHIN, framed, recv, send};
use crate::p2p::Client;

/// `/gpux/stage/1`.
pub(crate) const STAGE: StreamProtocol = StreamProtocol::new(plane_wire::STAGE_PROTOCOL);

/// How long the host may take to plan (it lists its images' layers).
pub(crate) const PLAN_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);
/// How long the host may take to load the image once every byte is there.
pub(crate) const LOAD_WITHIN: std::time::Duration = std::time::Duration::from_secs(15 * 60);
/// The longest wait for the next data frame, either side.
pub(crate) const DATA_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// The largest `manifest.json` read from an archive.
const MAX_MANIFEST: u64 = 1 << 20;

/// The chain ids of a stack of layers (moby's `layer.CreateChainID`): the first is its diff
/// id, each next one the sha256 of `"<previous chain> <diff id>"`, both `sha256:<hex>`.
pub(crate) fn chain_ids(diff_ids: &[[u8; 32]]) -> Vec<[u8; 32]> {
    let mut chains: Vec<[u8; 32]> = Vec::with_capacity(diff_ids.len());
    for diff in diff_ids {
        let next = match chains.last() {
            None => *diff,
            Some(parent) => Sha256::digest(format!(
                "sha256:{} sha256:{}",
                gpux_protocol::hex(parent),
                gpux_protocol::hex(diff)
            ))
            .into(),
        };
        chains.push(next);
    }
    chains
}

/// An image id: the sha256 of its config, byte for byte.
pub(crate) fn image_id(config: &[u8]) -> ImageDigest {
    ImageDigest(Sha256::digest(config).into())
}

/// The diff ids an image config lists (`rootfs.diff_ids`), base first.
pub(crate) fn diff_ids(config: &[u8]) -> anyhow::Result<Vec<[u8; 32]>> {
    #[derive(serde::Deserialize)]
    struct Config {
        rootfs: RootFs,
    }
    #[derive(serde::Deserialize)]
    struct RootFs {
        #[serde(rename = "type")]
        kind: String,
        diff_ids: Vec<String>,
    }
    let config: Config = serde_json::from_slice(config).context("the image config")?;
    if config.rootfs.kind != "layers" {
        bail!(
            "the image config's rootfs is {:?}, not layers",
            config.rootfs.kind
        );
    }
    config
        .rootfs
        .diff_ids
        .iter()
        .map(|d| {
            d.parse::<ImageDigest>()
                .map(|d| d.0)
                .map_err(|e| anyhow::anyhow!("a diff id in the image config: {e}"))
        })
        .collect()
}

/// One layer of an [`Archive`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ArchiveLayer {
    /// sha256 of the layer tar (checked against the config).
    pub(crate) diff_id: [u8; 32],
    /// Where its bytes start in the archive.
    pub(crate) offset: u64,
    /// Its size.
    pub(crate) bytes: u64,
    /// Its blake3.
    pub(crate) blake3: [u8; 32],
}

/// A `docker save` archive of one image, indexed: its config, and where each layer's
/// (uncompressed) tar lies in the file, hashed.
#[derive(Debug, Clone)]
pub(crate) struct Archive {
    /// The archive.
    pub(crate) path: PathBuf,
    /// The image id.
    pub(crate) image: ImageDigest,
    /// The config, byte for byte.
    pub(crate) config: Vec<u8>,
    /// The layers, base first.
    pub(crate) layers: Vec<ArchiveLayer>,
}

impl Archive {
    /// Reads and checks the archive at `path` (blocking: it hashes every layer). It must
    /// hold exactly one image, with uncompressed layers whose sha256 are the config's diff
    /// ids (what `docker save` writes, in its legacy and its OCI layout alike).
    pub(crate) fn open(path: &Path) -> anyhow::Result<Self> {
        let mut file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let files = index_tar(&mut file).with_context(|| format!("reading {}", path.display()))?;
        let find = |name: &str| -> anyhow::Result<(u64, u64)> {
            files
                .get(name)
                .copied()
                .with_context(|| format!("the archive has no {name}"))
        };
        let (at, size) = find("manifest.json").context("is it a `docker save` archive?")?;
        if size > MAX_MANIFEST {
            bail!("its manifest.json is over {MAX_MANIFEST} bytes");
        }
        let manifest = read_at(&mut file, at, size)?;
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Entry {
            config: String,
            layers: Vec<String>,
        }
        let entries: Vec<Entry> = serde_json::from_slice(&manifest).context("its manifest.json")?;
        let [entry] = &entries[..] else {
            bail!(
                "it holds {} images; `docker save` one image into it",
                entries.len()
            );
        };
        let (at, size) = find(&entry.config)?;
        if size > u64::from(MAX_STAGE_CONFIG) {
            bail!("its image config is over {MAX_STAGE_CONFIG} bytes");
        }
        let config = read_at(&mut file, at, size)?;
        let image = image_id(&config);
        let diff_ids = diff_ids(&config)?;
        if diff_ids.len() != entry.layers.len() {
            bail!(
                "the config lists {} layers, the manifest {}",
                diff_ids.len(),
                entry.layers.len()
            );
        }
        if diff_ids.len() > MAX_STAGE_LAYERS {
            bail!("the image has over {MAX_STAGE_LAYERS} layers");
        }
        let mut layers = Vec::with_capacity(diff_ids.len());
        for (i, (name, diff_id)) in entry.layers.iter().zip(diff_ids).enumerate() {
            let (offset, bytes) = find(name)?;
            let (sha, blake3) = hash_at(&mut file, offset, bytes)?;
            if sha != diff_id {
                bail!(
                    "layer {i} ({name}) does not hash to its diff id: a compressed or damaged \
                     layer (gpux stages the uncompressed layers `docker save` writes)"
                );
            }
            layers.push(ArchiveLayer {
                diff_id,
                offset,
                bytes,
                blake3,
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            image,
            config,
            layers,
        })
    }

    /// The config and every layer, bytes.
    pub(crate) fn total_bytes(&self) -> u64 {
        self.config.len() as u64 + self.layers.iter().map(|l| l.bytes).sum::<u64>()
    }

    fn open_frame(&self) -> anyhow::Result<StageOpen> {
        let layers = self
            .layers
            .iter()
            .map(|l| StageLayer {
                diff_id: l.diff_id,
                bytes: l.bytes,
                blake3: l.blake3,
            })
            .collect();
        Ok(StageOpen {
            image: self.image,
            config_bytes: u32::try_from(self.config.len()).context("the config's size")?,
            layers: BoundedVec::new(layers).map_err(|e| anyhow::anyhow!("layers: {e}"))?,
        })
    }
}

/// Every regular file of a tar (and every link to one), by normalised path: where its bytes
/// start and its size.
fn index_tar(file: &mut std::fs::File) -> anyhow::Result<BTreeMap<String, (u64, u64)>> {
    let mut files = BTreeMap::new();
    let mut links = Vec::new();
    let mut archive = tar::Archive::new(file);
    for entry in archive.entries_with_seek()? {
        let entry = entry?;
        let path = normalise(Path::new("."), &entry.path()?);
        let kind = entry.header().entry_type();
        if kind.is_file() {
            files.insert(path, (entry.raw_file_position(), entry.size()));
        } else if kind.is_symlink()
            && let Some(target) = entry.link_name()?
        {
            // `docker save` links a layer saved twice to its first copy.
            let parent = Path::new(&path)
                .parent()
                .unwrap_or(Path::new("."))
                .to_owned();
            links.push((path, normalise(&parent, &target)));
        }
    }
    for (path, target) in links {
        if let Some(found) = files.get(&target).copied() {
            files.insert(path, found);
        }
    }
    Ok(files)
}

/// `path` (relative to `base`) with `.` and `..` resolved, `/`-joined, never above the root.
fn normalise(base: &Path, path: &Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    for component in base.join(path).components() {
        match component {
            Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            Component::ParentDir => {
                parts.pop();
            }
            _ => {}
        }
    }
    parts.join("/")
}

fn read_at(file: &mut std::fs::File, at: u64, size: u64) -> anyhow::Result<Vec<u8>> {
    file.seek(SeekFrom::Start(at))?;
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(size).read_to_end(&mut bytes)?;
    if bytes.len() as u64 != size {
        bail!("the archive ends early");
    }
    Ok(bytes)
}

/// sha256 and blake3 of `size` bytes at `at`.
fn hash_at(file: &mut std::fs::File, at: u64, size: u64) -> anyhow::Result<([u8; 32], [u8; 32])> {
    file.seek(SeekFrom::Start(at))?;
    let mut sha = Sha256::new();
    let mut blake = blake3::Hasher::new();
    let mut left = size;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        let n = file.read(&mut buf[..left.min(1 << 20) as usize])?;
        if n == 0 {
            bail!("the archive ends early");
        }
        sha.update(&buf[..n]);
        blake.update(&buf[..n]);
        left -= n as u64;
    }
    Ok((sha.finalize().into(), *blake.finalize().as_bytes()))
}

/// What one staging sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sent {
    /// Layers the host asked for (in whole or from where an interrupted staging stopped).
    pub(crate) layers: usize,
    /// Bytes sent: the config and those layers' missing parts.
    pub(crate) bytes: u64,
}

/// Why a staging did not end with the image loaded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StageError {
    /// The host said no, or the image could not load: asking again is no use.
    #[error("{0}")]
    Refused(String),
    /// The stream broke: a retry goes on from what arrived.
    #[error("{0}")]
    Broken(String),
}

/// Stages `archive` on `host`: the image is loaded there, held for this node, when it
/// returns `Ok`.
pub(crate) async fn stage_image(
    net: &Client,
    host: PeerId,
    archive: &Archive,
) -> Result<Sent, StageError> {
    let broken = |e: &dyn std::fmt::Display| StageError::Broken(format!("staging: {e}"));
    let open = archive
        .open_frame()
        .map_err(|e| StageError::Refused(e.to_string()))?;
    let stream = net
        .open_stream(host, STAGE, OPEN_WITHIN)
        .await
        .map_err(|e| broken(&e))?;
    let mut stream = framed(stream);
    send(&mut stream, &open).await.map_err(|e| broken(&e))?;
    match recv::<Opened>(&mut stream, OPEN_WITHIN)
        .await
        .map_err(|e| broken(&e))?
    {
        Opened::Yes => {}
        Opened::No { code, detail } => {
            return Err(StageError::Refused(format!(
                "the host refused to stage the image ({}): {detail}",
                serde_json::to_string(&code)
                    .unwrap_or_default()
                    .trim_matches('"')
            )));
        }
    }
    let plan: StagePlan = recv(&mut stream, PLAN_WITHIN)
        .await
        .map_err(|e| broken(&e))?;
    // The host may answer before every byte is sent (a layer arrived damaged, a deadline
    // passed): its answer is read while the bytes go, and ends the staging at once.
    let (mut sink, mut source) = stream.split();
    let sending = send_all(&mut sink, archive, &plan);
    let answer = async {
        match source.next().await {
            None => Err(broken(&"the host closed the stream")),
            Some(Err(e)) => Err(broken(&e)),
            Some(Ok(frame)) => plane_wire::decode::<StageDone>(&frame).map_err(|e| broken(&e)),
        }
    };
    tokio::pin!(sending, answer);
    let (sent, done) = tokio::select! {
        sent = &mut sending => {
            let sent = sent?;
            // Every byte is there: the host loads the image, and answers within the time
            // a load may take (the sending, however long, was bounded by the host's pace).
            match tokio::time::timeout(LOAD_WITHIN, &mut answer).await {
                Ok(done) => (Some(sent), done?),
                Err(_) => {
                    return Err(broken(&format!(
                        "no answer within {LOAD_WITHIN:?} of the last byte"
                    )));
                }
            }
        }
        done = &mut answer => (None, done?),
    };
    match (done, sent) {
        (StageDone::Loaded, Some(sent)) => Ok(sent),
        (StageDone::Loaded, None) => Err(StageError::Refused(
            "the host said loaded before it had every byte".into(),
        )),
        (StageDone::Failed { detail }, _) => Err(StageError::Refused(format!(
            "the host could not stage the image: {detail}"
        ))),
    }
}

/// Sends the config (when the plan asks for it) and the layers the plan names, from where
/// the host has them, a megabyte of frames per flush.
async fn send_all(
    sink: &mut futures::stream::SplitSink<super::FramedStream, bytes::Bytes>,
    archive: &Archive,
    plan: &StagePlan,
) -> Result<Sent, StageError> {
    let broken = |e: &dyn std::fmt::Display| StageError::Broken(format!("staging: {e}"));
    let mut sent = Sent::default();
    if plan.config {
        send_block(sink, &archive.config).await?;
        sent.bytes += archive.config.len() as u64;
    }
    let mut file = tokio::fs::File::open(&archive.path)
        .await
        .map_err(|e| StageError::Refused(format!("{}: {e}", archive.path.display())))?;
    // Each layer at most once, in the archive's order: a host cannot multiply the upload.
    if plan
        .layers
        .iter()
        .zip(plan.layers.iter().skip(1))
        .any(|(a, b)| a.index >= b.index)
    {
        return Err(StageError::Refused(
            "the host asked for a layer twice or out of order".into(),
        ));
    }
    for need in plan.layers.iter() {
        let Some(layer) = archive.layers.get(usize::from(need.index)) else {
            return Err(StageError::Refused(format!(
                "the host asked for layer {}, which the image does not have",
                need.index
            )));
        };
        if need.from > layer.bytes {
            return Err(StageError::Refused(
                "the host asked for bytes past a layer's end".into(),
            ));
        }
        file.seek(SeekFrom::Start(layer.offset + need.from))
            .await
            .map_err(|e| broken(&e))?;
        let mut left = layer.bytes - need.from;
        while left > 0 {
            let mut block = vec![0u8; left.min(1 << 20) as usize];
            file.read_exact(&mut block).await.map_err(|e| broken(&e))?;
            left -= block.len() as u64;
            sent.bytes += block.len() as u64;
            send_block(sink, &block).await?;
        }
        sent.layers += 1;
    }
    Ok(sent)
}

/// Sends `block` as `StageData` frames and flushes them; a host that reads nothing for as
/// long as a load may take is gone.
async fn send_block(
    sink: &mut futures::stream::SplitSink<super::FramedStream, bytes::Bytes>,
    block: &[u8],
) -> Result<(), StageError> {
    let broken = |e: &dyn std::fmt::Display| StageError::Broken(format!("staging: {e}"));
    let stalled = |_| broken(&format!("the host read nothing for {LOAD_WITHIN:?}"));
    for chunk in block.chunks(MAX_FILE_DATA) {
        let data =
            BoundedBytes::new(chunk.to_vec()).map_err(|e| StageError::Refused(e.to_string()))?;
        let frame = bytes::Bytes::from(plane_wire::encode(&StageData(data)));
        tokio::time::timeout(LOAD_WITHIN, sink.feed(frame))
            .await
            .map_err(stalled)?
            .map_err(|e| broken(&e))?;
    }
    tokio::time::timeout(LOAD_WITHIN, sink.flush())
        .await
        .map_err(stalled)?
        .map_err(|e| broken(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_ids_follow_moby() {
        let a = [1u8; 32];
        let b = [2u8; 32];
        let chains = chain_ids(&[a, b]);
        assert_eq!(chains[0], a);
        let expected: [u8; 32] = Sha256::digest(format!(
            "sha256:{} sha256:{}",
            "01".repeat(32),
            "02".repeat(32)
        ))
        .into();
        assert_eq!(chains[1], expected);
        // The same top layer on another parent is another chain.
        assert_ne!(chain_ids(&[b, b])[1], chains[1]);
    }

    #[test]
    fn paths_resolve_inside_the_archive() {
        assert_eq!(
            normalise(Path::new("abc"), Path::new("../def/layer.tar")),
            "def/layer.tar"
        );
        assert_eq!(
            normalise(Path::new("."), Path::new("./manifest.json")),
            "manifest.json"
        );
        assert_eq!(normalise(Path::new("."), Path::new("../../x")), "x");
    }

    #[test]
    fn configs_must_list_layers() {
        let config = format!(
            r#"{{"rootfs":{{"type":"layers","diff_ids":["sha256:{}"]}}}}"#,
            "ab".repeat(32)
        );
        assert_eq!(diff_ids(config.as_bytes()).unwrap(), vec![[0xab; 32]]);
        assert!(diff_ids(br#"{"rootfs":{"type":"other","diff_ids":[]}}"#).is_err());
        assert!(diff_ids(br#"{"rootfs":{"type":"layers","diff_ids":["md5:00"]}}"#).is_err());
    }

    /// A tiny archive in `docker save`'s legacy layout, with a linked second copy of a layer.
    fn archive(dir: &Path) -> (PathBuf, Vec<u8>, Vec<u8>) {
        let layer = b"not really a tar, but bytes".to_vec();
        let diff = gpux_protocol::hex(&Sha256::digest(&layer));
        let config = format!(
            r#"{{"rootfs":{{"type":"layers","diff_ids":["sha256:{diff}","sha256:{diff}"]}}}}"#
        )
        .into_bytes();
        let manifest =
            br#"[{"Config":"cfg.json","RepoTags":null,"Layers":["a/layer.tar","b/layer.tar"]}]"#;
        let path = dir.join("image.tar");
        let mut builder = tar::Builder::new(std::fs::File::create(&path).unwrap());
        let mut add = |name: &str, bytes: &[u8]| {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder.append_data(&mut header, name, bytes).unwrap();
        };
        add("a/layer.tar", &layer);
        add("cfg.json", &config);
        add("manifest.json", manifest);
        let mut link = tar::Header::new_gnu();
        link.set_entry_type(tar::EntryType::Symlink);
        link.set_size(0);
        link.set_cksum();
        builder
            .append_link(&mut link, "b/layer.tar", "../a/layer.tar")
            .unwrap();
        builder.finish().unwrap();
        (path, config, layer)
    }

    #[test]
    fn archives_are_indexed_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let (path, config, layer) = archive(dir.path());
        let archive = Archive::open(&path).unwrap();
        assert_eq!(archive.image, image_id(&config));
        assert_eq!(archive.config, config);
        assert_eq!(archive.layers.len(), 2);
        assert_eq!(archive.layers[0], archive.layers[1]);
        let bytes = std::fs::read(&path).unwrap();
        let l = archive.layers[0];
        assert_eq!(&bytes[l.offset as usize..][..l.bytes as usize], &layer[..]);
        assert_eq!(l.blake3, *blake3::hash(&layer).as_bytes());

        // A layer that is not what the config says (compressed, or damaged) is refused.
        let mut damaged = bytes.clone();
        damaged[l.offset as usize] ^= 1;
        std::fs::write(&path, damaged).unwrap();
        let err = Archive::open(&path).unwrap_err().to_string();
        assert!(err.contains("does not hash to its diff id"), "{err}");
        std::fs::write(&path, b"no tar at all").unwrap();
        assert!(Archive::open(&path).is_err());
    }
}

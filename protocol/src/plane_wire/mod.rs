//! The frames of the workload plane: the streams a lease's renter opens to its host to work
//! in the lease's container (`/gpux/exec/1`, `/gpux/forward/1`, `/gpux/files/1`), and the
//! stream a renter stages its own image on before it asks for a lease (`/gpux/stage/1`).
//!
//! Each frame is bincode 2 (the standard configuration), at most [`MAX_PLANE_FRAME`] bytes,
//! every byte consumed, in its one canonical encoding; on the stream each is preceded by its
//! length (4 bytes, big-endian). Frames are not signed: the stream's noise handshake proves
//! the renter's peer id, and the host serves a stream only when that peer signed the lease.
//!
//! A stream starts with the renter's open frame ([`ExecOpen`], [`ForwardOpen`]) and the
//! host's [`Opened`] answer. Then:
//! - exec: [`ExecInput`] frames from the renter, [`ExecOutput`] frames from the host, the
//!   last of which is [`ExecOutput::Exit`];
//! - forward: raw bytes both ways, the container's TCP connection, until either side closes;
//! - files: [`FilesRequest`] frames, each answered by [`FilesResponse`] frames;
//! - stage: the host's [`StagePlan`], the renter's [`StageData`] frames (the config, then
//!   the layers the host lacks), and the host's [`StageDone`] once the image is loaded;
//! - pull: the renter's [`PullOpen`] (with the registry's credentials, when it needs any),
//!   then the host's [`PullStatus`] frames: progress while it pulls, then done or failed.
//!
//! ```
//! use gpux_protocol::plane_wire::{self, ExecInput};
//!
//! let frame = plane_wire::encode(&ExecInput::Resize { rows: 24, cols: 80 });
//! let back: ExecInput = plane_wire::decode(&frame)?;
//! assert_eq!(back, ExecInput::Resize { rows: 24, cols: 80 });
//! # Ok::<(), gpux_protocol::FrameError>(())
//! ```

use bincode::{Decode, Encode};

use crate::codec::{BoundedBytes, BoundedString, BoundedVec, FrameError};
use crate::messages::EnvVar;
use crate::types::{ContentId, ImageDigest};

mod files;
pub use files::{
    Entry, EntryKind, FilesError, FilesOpen, FilesRequest, FilesResponse, MAX_DETAIL_CHARS,
    MAX_FILE_DATA, MAX_LIST_PAGE, MAX_PATH_BYTES, WorkspacePath, is_workspace_path,
};

/// `gpux exec`: a command in the lease's container.
pub const EXEC_PROTOCOL: &str = "/gpux/exec/1";
/// `gpux forward`: a TCP connection to a port on the container's own loopback.
pub const FORWARD_PROTOCOL: &str = "/gpux/forward/1";
/// `gpux cp`: files in and out of the lease's workspace.
pub const FILES_PROTOCOL: &str = "/gpux/files/1";
/// `gpux rent --image`: a renter's own image, staged on the host before the lease.
pub const STAGE_PROTOCOL: &str = "/gpux/stage/1";
/// `gpux rent --challenge`: the performance challenge on a held lease's GPUs.
pub const CHALLENGE_PROTOCOL: &str = "/gpux/challenge/1";
/// `gpux rent --image REGISTRY/NAME:TAG`: the host pulls an image from its registry before
/// the lease.
pub const PULL_PROTOCOL: &str = "/gpux/pull/1";
/// `gpux ssh`: an SSH connection to the host's node for a lease (no sshd in the container).
pub const SSH_PROTOCOL: &str = "/gpux/ssh/1";
/// The longest image reference a pull names, bytes.
pub const MAX_REFERENCE_BYTES: usize = 512;

/// The largest plane frame, either way.
pub const MAX_PLANE_FRAME: usize = MAX_FILE_DATA + 16 * 1024;
/// The most bytes of stdin or output in one exec frame.
pub const MAX_EXEC_DATA: usize = 64 * 1024;
/// The most layers in a staged image (Docker's own limit is 127 above the base).
pub const MAX_STAGE_LAYERS: usize = 128;
/// The largest image config staged, bytes.
pub const MAX_STAGE_CONFIG: u32 = 1 << 20;

/// The renter's first frame on `/gpux/exec/1`.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct ExecOpen {
    /// The lease whose container runs the command.
    pub lease: ContentId,
    /// The command and its arguments (never empty).
    pub command: BoundedVec<BoundedString<4096>, 256>,
    /// Extra environment; `NVIDIA_*` names are refused, as in a lease request.
    pub env: BoundedVec<EnvVar, 64>,
    /// A pseudo-terminal, with this size (rows, columns).
    pub tty: Option<(u16, u16)>,
}

/// The renter's first frame on `/gpux/forward/1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub struct ForwardOpen {
    /// The lease whose container is reached.
    pub lease: ContentId,
    /// The TCP port on the container's loopback (127.0.0.1).
    pub port: u16,
}

/// The renter's first frame on `/gpux/ssh/1`: the lease logged in to. After the host's
/// [`Opened::Yes`], the stream carries an SSH connection (the host's node is the server).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub struct SshOpen {
    /// The lease.
    pub lease: ContentId,
}

/// The host's answer to an open frame.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum Opened {
    /// Served: the stream goes on.
    Yes,
    /// Refused: the host closes the stream after this frame.
    No {
        /// Why, as a code.
        code: PlaneRefusal,
        /// Why, in words (at most [`MAX_DETAIL_CHARS`]).
        detail: BoundedString<800>,
    },
}

impl Opened {
    /// A refusal, its detail cut to [`MAX_DETAIL_CHARS`].
    pub fn refused(code: PlaneRefusal, detail: &str) -> Self {
        let detail: String = detail.chars().take(MAX_DETAIL_CHARS).collect();
        Opened::No {
            code,
            detail: BoundedString::new(detail).unwrap_or_default(),
        }
    }
}

/// Why a host refused a plane stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum PlaneRefusal {
    /// The open frame did not read, or asked for something invalid.
    Malformed,
    /// No lease with that id on this host, or not one the stream's peer rented.
    NotYourLease,
    /// The lease's container does not run (not yet, or no more).
    NotRunning,
    /// The host serves no more streams of this kind for the lease now.
    Busy,
    /// The host cannot do this (for example, it has no relay for forwards).
    Unavailable,
}

/// The renter's first frame on `/gpux/challenge/1`: the held lease challenged. The host
/// answers [`Opened`] (the renter times that exchange: the round trip the challenge's size
/// must dwarf), then takes one signed `ChallengeRequest` and answers [`ChallengeAnswer`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub struct ChallengeOpen {
    /// The lease, held for its commit.
    pub lease: ContentId,
}

/// The largest signed `ChallengeResponse` on a challenge stream.
pub const MAX_CHALLENGE_RESPONSE: usize = 1024;
/// The most rows a renter may pick.
pub const MAX_PICKED_ROWS: usize = 512;
/// The largest row of a product (`MAX_CHALLENGE_N` values of 4 bytes).
pub const MAX_CHALLENGE_ROW: usize = 4 * crate::messages::MAX_CHALLENGE_N as usize;
/// The longest Merkle path (a tree over `MAX_CHALLENGE_M` rows).
pub const MAX_CHALLENGE_PATH: usize = crate::messages::MAX_CHALLENGE_M.trailing_zeros() as usize;

/// The most fill blocks a renter may pick.
pub const MAX_PICKED_BLOCKS: usize = 256;
/// The longest Merkle path of a fill (a tree over `MAX_FILL_LANES × MAX_FILL_BLOCKS` blocks).
pub const MAX_FILL_PATH: usize = 40;
/// The bytes of a fill block.
pub const FILL_BLOCK_BYTES: usize = 1024;

/// A block of a challenge's memory fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Encode, Decode)]
pub struct BlockAt {
    /// The lane.
    pub lane: u32,
    /// The block's index in its lane.
    pub index: u32,
}

/// What the renter sends once it has the host's commitment: the rows it checks, ascending
/// and distinct, each below the challenge's `m`, and the fill blocks it checks (each with
/// an index of at least 2), ascending and distinct.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct ChallengePick {
    /// The rows.
    pub rows: BoundedVec<u32, MAX_PICKED_ROWS>,
    /// The fill's blocks.
    pub blocks: BoundedVec<BlockAt, MAX_PICKED_BLOCKS>,
}

/// What the host sends on a challenge stream after the renter's request.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum ChallengeAnswer {
    /// The signed `ChallengeResponse`: the host's commitment to its product (sent as soon
    /// as the product is computed; the renter's clock stops here).
    Response(BoundedBytes<MAX_CHALLENGE_RESPONSE>),
    /// A picked row, in the order picked: its values (`n` little-endian `i32`s) and the
    /// siblings from its leaf to the committed root.
    Row {
        /// The row's index.
        index: u32,
        /// Its values.
        values: BoundedBytes<MAX_CHALLENGE_ROW>,
        /// Its Merkle path, bottom first.
        path: BoundedVec<ContentId, MAX_CHALLENGE_PATH>,
    },
    /// All picked rows and blocks sent.
    Done,
    /// The host will not answer (why).
    Failed(BoundedString<800>),
    /// The Merkle root over the memory fill's blocks, sent the moment the fill is done
    /// (the renter times the fill up to here); the signed response repeats it.
    Filled(ContentId),
    /// A fill block, after the rows: for each picked block, the block, its predecessor and
    /// its reference, in that order; each its words (128 little-endian `u64`s) and its
    /// Merkle path, bottom first.
    Block {
        /// Where it is.
        at: BlockAt,
        /// Its words.
        words: BoundedBytes<FILL_BLOCK_BYTES>,
        /// Its Merkle path.
        path: BoundedVec<ContentId, MAX_FILL_PATH>,
    },
}

/// What the renter sends on an exec stream after it was opened.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum ExecInput {
    /// Bytes for the command's stdin.
    Stdin(BoundedBytes<MAX_EXEC_DATA>),
    /// The end of stdin.
    StdinEnd,
    /// The renter's terminal changed size (tty only).
    Resize {
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
}

/// What the host sends on an exec stream after it was opened.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum ExecOutput {
    /// Bytes the command wrote to stdout (with a tty: to its terminal).
    Stdout(BoundedBytes<MAX_EXEC_DATA>),
    /// Bytes the command wrote to stderr (never with a tty).
    Stderr(BoundedBytes<MAX_EXEC_DATA>),
    /// The command ended: its exit code (`None` when Docker could not say). The last frame.
    Exit(Option<i64>),
}

/// One layer of an image being staged, in the order of the config's `rootfs.diff_ids`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub struct StageLayer {
    /// Its diff id: sha256 of the uncompressed layer tar (what the config lists).
    pub diff_id: [u8; 32],
    /// The layer tar's size, bytes.
    pub bytes: u64,
    /// blake3 of the layer tar, checked by the host before it loads anything.
    pub blake3: [u8; 32],
}

/// The renter's first frame on `/gpux/stage/1`: the image it will name in a lease request.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct StageOpen {
    /// The image id: sha256 of its config, byte for byte.
    pub image: ImageDigest,
    /// The config's size, bytes (at most [`MAX_STAGE_CONFIG`]).
    pub config_bytes: u32,
    /// Its layers, base first.
    pub layers: BoundedVec<StageLayer, MAX_STAGE_LAYERS>,
}

/// Where a layer's bytes start again: the host has `from` bytes of it already.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub struct StageNeed {
    /// The layer's index in [`StageOpen::layers`].
    pub index: u16,
    /// How much of it the host has (from an interrupted staging).
    pub from: u64,
}

/// The host's plan, after [`Opened::Yes`]: what the renter sends, in this order, as
/// [`StageData`] frames: the config (when `config`), then each needed layer from its `from`.
/// Layers left out are in the host's layer store already, with their whole chain of parents.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct StagePlan {
    /// Whether the config is needed (not when the host holds the image for this renter).
    pub config: bool,
    /// The layers needed, by index, ascending.
    pub layers: BoundedVec<StageNeed, MAX_STAGE_LAYERS>,
}

/// Bytes of the config or a layer, in the plan's order.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct StageData(pub BoundedBytes<MAX_FILE_DATA>);

/// The host's last frame on a stage stream.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum StageDone {
    /// The image is loaded, its id checked, and held for this renter: a lease request may
    /// name it now.
    Loaded,
    /// It failed; what arrived and verified is kept for a retry.
    Failed {
        /// Why, in words (at most [`MAX_DETAIL_CHARS`]).
        detail: BoundedString<800>,
    },
}

impl StageDone {
    /// A failure, its detail cut to [`MAX_DETAIL_CHARS`].
    pub fn failed(detail: &str) -> Self {
        let detail: String = detail.chars().take(MAX_DETAIL_CHARS).collect();
        StageDone::Failed {
            detail: BoundedString::new(detail).unwrap_or_default(),
        }
    }
}

/// A registry's credentials for one pull. They travel only on the pull's stream (noise
/// encrypted, to the chosen host); the host uses them for that pull and keeps them nowhere.
/// Never printed: its `Debug` shows the user name only.
#[derive(Clone, PartialEq, Eq, Encode, Decode)]
pub struct RegistryAuth {
    /// The user name.
    pub username: BoundedString<256>,
    /// The password or access token.
    pub password: BoundedString<4096>,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("username", &self.username.as_str())
            .field("password", &"<hidden>")
            .finish()
    }
}

/// The renter's one frame on `/gpux/pull/1`: the image the host is to pull and hold for it.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct PullOpen {
    /// `[REGISTRY/]NAME[:TAG][@sha256:DIGEST]`, as Docker reads it (Docker Hub when no
    /// registry is named).
    pub reference: BoundedString<MAX_REFERENCE_BYTES>,
    /// The registry's credentials, for a private image.
    pub auth: Option<RegistryAuth>,
}

/// Why a host did not pull an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum PullFailure {
    /// The reference does not read, or names nothing Docker can pull.
    Malformed,
    /// The host pulls no images, or none from that registry (its offers say which).
    NotAllowed,
    /// The registry refused the credentials, or wants some.
    Unauthorized,
    /// No such image or tag at the registry.
    NotFound,
    /// The image is larger than the host takes.
    TooLarge,
    /// The pull took longer than the host allows.
    TimedOut,
    /// The host pulls no more images for this renter now (or for anyone).
    Busy,
    /// Anything else (the registry could not be reached, the disk is full...).
    Failed,
}

/// The host's frames on `/gpux/pull/1`: progress while it pulls, then one last frame.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum PullStatus {
    /// How far the pull is: bytes downloaded of those Docker has announced (more layers may
    /// be announced later), and layers done of those announced.
    Progress {
        /// Bytes downloaded (layers already here count as done).
        done: u64,
        /// Bytes announced.
        total: u64,
        /// Layers done.
        layers_done: u16,
        /// Layers announced.
        layers: u16,
    },
    /// Pulled and held for this renter: a lease request may name `image` now.
    Done {
        /// The image id (sha256 of its config).
        image: ImageDigest,
        /// Its size on the host, bytes.
        bytes: u64,
        /// Every layer was here already (the host had it cached).
        warm: bool,
    },
    /// Not pulled; nothing is held.
    Failed {
        /// Why, as a code.
        code: PullFailure,
        /// Why, in words (at most [`MAX_DETAIL_CHARS`]).
        detail: BoundedString<800>,
    },
}

impl PullStatus {
    /// A failure, its detail cut to [`MAX_DETAIL_CHARS`].
    pub fn failed(code: PullFailure, detail: &str) -> Self {
        let detail: String = detail.chars().take(MAX_DETAIL_CHARS).collect();
        PullStatus::Failed {
            code,
            detail: BoundedString::new(detail).unwrap_or_default(),
        }
    }
}

/// Encodes a plane frame (without its length prefix).
pub fn encode<T: Encode>(value: &T) -> Vec<u8> {
    crate::codec::encode_frame(value)
}

/// Decodes a plane frame: at most [`MAX_PLANE_FRAME`] bytes, every byte consumed, canonical.
pub fn decode<T: Decode<()> + Encode>(bytes: &[u8]) -> Result<T, FrameError> {
    crate::codec::decode_frame::<T, MAX_PLANE_FRAME>(bytes)
}

/// Frames that carry a file's bytes as their one and last field ([`FilesRequest::Data`],
/// [`FilesResponse::Data`]), which are written and read without copying the bytes into or
/// out of a value: a sender reads the file straight in behind [`data_head`], a receiver
/// takes the bytes where [`data_in`] finds them. Either way the frame is exactly what
/// [`encode`] writes and [`decode`] accepts.
pub trait DataFrame: Encode {
    /// The frame with no bytes.
    fn no_data() -> Self;
}

impl DataFrame for FilesRequest {
    fn no_data() -> Self {
        FilesRequest::Data(BoundedBytes::default())
    }
}

impl DataFrame for FilesResponse {
    fn no_data() -> Self {
        FilesResponse::Data(BoundedBytes::default())
    }
}

/// The variant's tag: the frame with no bytes, less their length (a zero, one byte).
fn data_tag<T: DataFrame>() -> Vec<u8> {
    let mut tag = encode(&T::no_data());
    tag.pop();
    tag
}

/// What precedes `len` bytes in their data frame of `T`: the frame is this head and then
/// the bytes, as [`encode`] writes it.
pub fn data_head<T: DataFrame>(len: usize) -> Vec<u8> {
    let mut head = data_tag::<T>();
    head.extend(encode(&(len as u64)));
    head
}

/// Where the bytes lie in `frame` when it is a data frame of `T` in canonical form with at
/// most [`MAX_FILE_DATA`] of them (what [`decode`] would accept as one); `None` for any
/// other frame, which is then decoded as usual.
pub fn data_in<T: DataFrame>(frame: &[u8]) -> Option<std::ops::Range<usize>> {
    let tag = data_tag::<T>();
    let rest = frame.strip_prefix(tag.as_slice())?;
    let (len, used): (u64, usize) =
        bincode::decode_from_slice(rest, bincode::config::standard()).ok()?;
    let len = usize::try_from(len).ok().filter(|&n| n <= MAX_FILE_DATA)?;
    // The length's one canonical form, and nothing after the bytes.
    if encode(&(len as u64)).len() != used || rest.len() - used != len {
        return None;
    }
    Some(frame.len() - len..frame.len())
}

#[cfg(test)]
mod tests {
    #[test]
    fn data_frames_are_found_in_place_exactly_when_they_decode_as_data() {
        for len in [
            0,
            1,
            250,
            251,
            252,
            65_535,
            65_536,
            MAX_FILE_DATA - 1,
            MAX_FILE_DATA,
        ] {
            let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
            let framed = encode(&FilesResponse::Data(
                BoundedBytes::new(data.clone()).unwrap(),
            ));
            let mut built = data_head::<FilesResponse>(len);
            built.extend(&data);
            assert_eq!(built, framed, "{len} bytes");
            let at = data_in::<FilesResponse>(&framed).expect("a data frame");
            assert_eq!(&framed[at], &data[..]);
            // The request's tag differs: not taken for a response's data.
            let request = encode(&FilesRequest::Data(BoundedBytes::new(data).unwrap()));
            assert!(data_in::<FilesResponse>(&request).is_none());
            assert_eq!(
                data_in::<FilesRequest>(&request).map(|r| r.len()),
                Some(len)
            );
        }
        // Other frames, short and long ones, non-canonical lengths, trailing bytes, more
        // than a data frame may hold: not in place (and decode says why, as for any frame).
        let frame = encode(&FilesResponse::Data(
            BoundedBytes::new(vec![9; 300]).unwrap(),
        ));
        let mut trailing = frame.clone();
        trailing.push(0);
        let mut short = frame.clone();
        short.pop();
        let mut wide = data_tag::<FilesResponse>();
        wide.extend([253, 3, 0, 0, 0, 0, 0, 0, 0, 7, 7, 7]);
        let mut huge = data_head::<FilesResponse>(MAX_FILE_DATA + 1);
        huge.resize(huge.len() + MAX_FILE_DATA + 1, 0);
        for bad in [
            encode(&FilesResponse::Done),
            encode(&FilesResponse::End([0; 32])),
            trailing,
            short,
            wide,
            huge,
            vec![],
        ] {
            assert!(
                data_in::<FilesResponse>(&bad).is_none(),
                "{:?}",
                &bad[..bad.len().min(12)]
            );
            assert!(!matches!(
                decode::<FilesResponse>(&bad),
                Ok(FilesResponse::Data(_))
            ));
        }
    }

    use super::*;

    #[test]
    fn frames_round_trip_and_odd_bytes_are_refused() {
        let open = ExecOpen {
            lease: ContentId([3; 32]),
            command: BoundedVec::new(vec![BoundedString::new("id").unwrap()]).unwrap(),
            env: BoundedVec::new(vec![]).unwrap(),
            tty: Some((24, 80)),
        };
        let bytes = encode(&open);
        assert_eq!(decode::<ExecOpen>(&bytes).unwrap(), open);
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert_eq!(decode::<ExecOpen>(&trailing), Err(FrameError::Trailing(1)));
        assert!(matches!(
            decode::<ExecOpen>(&bytes[..bytes.len() - 1]),
            Err(FrameError::Undecodable(_))
        ));
        assert_eq!(
            decode::<ExecOutput>(&vec![0; MAX_PLANE_FRAME + 1]),
            Err(FrameError::TooLarge(MAX_PLANE_FRAME + 1))
        );
        // Stdin over its bound does not decode, whatever the frame's size.
        let big = encode(&vec![7u8; MAX_EXEC_DATA + 1]);
        let mut frame = vec![0u8];
        frame.extend(big);
        assert!(decode::<ExecInput>(&frame).is_err());
        let refused = Opened::refused(PlaneRefusal::Busy, &"x".repeat(500));
        let Opened::No { detail, .. } = decode::<Opened>(&encode(&refused)).unwrap() else {
            panic!("not a refusal");
        };
        assert_eq!(detail.len(), MAX_DETAIL_CHARS);
    }

    #[test]
    fn a_full_data_frame_fits_in_a_plane_frame() {
        let data = || BoundedBytes::new(vec![0xff; MAX_FILE_DATA]).unwrap();
        for len in [
            encode(&FilesRequest::Data(data())).len(),
            encode(&FilesResponse::Data(data())).len(),
            encode(&StageData(data())).len(),
        ] {
            assert!(len <= MAX_PLANE_FRAME, "{len}");
        }
        let frame = encode(&FilesResponse::Data(data()));
        assert!(matches!(
            decode::<FilesResponse>(&frame),
            Ok(FilesResponse::Data(d)) if d.len() == MAX_FILE_DATA
        ));
    }

    #[test]
    fn a_pull_round_trips_and_never_prints_its_password() {
        let open = PullOpen {
            reference: BoundedString::new("127.0.0.1:5000/team/train:1").unwrap(),
            auth: Some(RegistryAuth {
                username: BoundedString::new("team").unwrap(),
                password: BoundedString::new("s3cret-token").unwrap(),
            }),
        };
        assert_eq!(decode::<PullOpen>(&encode(&open)).unwrap(), open);
        let shown = format!("{open:?}");
        assert!(
            shown.contains("team") && !shown.contains("s3cret"),
            "{shown}"
        );
        for status in [
            PullStatus::Progress {
                done: 1 << 30,
                total: 4 << 30,
                layers_done: 2,
                layers: 9,
            },
            PullStatus::Done {
                image: ImageDigest([7; 32]),
                bytes: 5 << 30,
                warm: false,
            },
            PullStatus::failed(PullFailure::Unauthorized, &"y".repeat(900)),
        ] {
            let back = decode::<PullStatus>(&encode(&status)).unwrap();
            match (&status, &back) {
                (PullStatus::Failed { .. }, PullStatus::Failed { detail, .. }) => {
                    assert_eq!(detail.len(), MAX_DETAIL_CHARS)
                }
                _ => assert_eq!(back, status),
            }
        }
    }
}

//! The CUDA prover: the challenge computed on a real GPU through the NVIDIA driver alone.
//!
//! The driver's CUDA library (`libcuda.so`, part of every NVIDIA driver install) is loaded
//! at run time ([cudarc], dynamic loading): no CUDA toolkit on the host, and a machine
//! without the driver runs every other part of gpux. The kernels are the embedded PTX
//! ([`super::cuda`]), which the driver compiles for the GPU at hand when the module loads
//! (before the renter's clock starts).
//!
//! **The product** runs in passes of rows: `B` (transposed) is generated once; each pass
//! generates its rows of `A`, multiplies them on the tensor cores, hashes each row (a
//! chaining value per 1 KiB chunk, then BLAKE3's tree) into the row leaves. The Merkle
//! levels are computed on the GPU; the root alone comes back before the answer. Opening a
//! row recomputes it (its row of `A` and the product with `B`, still held): the product is
//! too large to keep (a one-second H100 challenge is 61 GB of rows).
//!
//! **The fill** runs a slice at a time (a launch per slice: every lane's earlier slices are
//! written before the next is read), then hashes every block and builds the levels. The
//! fill, its leaves and levels stay on the GPU until the blocks picked are opened.
//!
//! Opened paths are read node by node from the levels on the GPU (a few thousand 32-byte
//! copies, after the renter's clocks stopped).

// The driver API is foreign code: launching a kernel (`run`), allocating memory a kernel
// writes in full, and three device queries are the only unsafe calls in gpux outside the
// fake driver, each with its reason.
#![allow(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DriverError, LaunchArgs, LaunchConfig,
    PushKernelArg, result, sys,
};
use cudarc::nvrtc::Ptx;

use super::fill::{self, BLOCK_WORDS, Block, FillShape, OpenedBlock, Opening};
use super::merkle::{self, Hash};
use super::{Opened, Shape, cuda, tensor};

/// Why the CUDA prover cannot run or did not finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GpuError {
    /// No NVIDIA driver: `libcuda.so` does not load.
    #[error(
        "the NVIDIA driver's CUDA library (libcuda.so) is not on this machine: the CUDA prover needs the driver"
    )]
    NoDriver,
    /// No device with the UUID asked for.
    #[error("no CUDA device has UUID {0}")]
    NoDevice(String),
    /// The device predates INT8 tensor cores.
    #[error(
        "{name} (compute capability {major}.{minor}) has no INT8 tensor cores: the challenge needs 7.5 or later"
    )]
    TooOld {
        /// The device's name.
        name: String,
        /// Compute capability, major.
        major: u8,
        /// Compute capability, minor.
        minor: u8,
    },
    /// The work does not fit the device's free memory.
    #[error("{0}")]
    Memory(String),
    /// The driver refused a step.
    #[error("CUDA, {what}: {source}")]
    Driver {
        /// The step.
        what: &'static str,
        /// The driver's error.
        source: DriverError,
    },
}

fn driver(what: &'static str) -> impl FnOnce(DriverError) -> GpuError {
    move |source| GpuError::Driver { what, source }
}

/// A CUDA device, as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The driver's ordinal (not necessarily NVML's index).
    pub ordinal: usize,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as NVML and Docker name it.
    pub uuid: String,
    /// The device's name.
    pub name: String,
    /// Compute capability (major, minor).
    pub cc: (u8, u8),
    /// Its memory, bytes.
    pub memory_bytes: u64,
}

/// The UUID's usual text form from its 16 bytes.
pub fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex = |r: std::ops::Range<usize>| {
        bytes[r]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

/// Whether the driver's CUDA library loads here.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library by its usual names.
    unsafe { sys::is_culib_present() }
}

/// The CUDA devices the driver sees.
pub fn devices() -> Result<Vec<DeviceInfo>, GpuError> {
    if !driver_present() {
        return Err(GpuError::NoDriver);
    }
    result::init().map_err(driver("initialising the driver"))?;
    let count = result::device::get_count().map_err(driver("counting devices"))?;
    let mut out = Vec::new();
    for ordinal in 0..count {
        let dev = result::device::get(ordinal).map_err(driver("finding a device"))?;
        let name = result::device::get_name(dev).map_err(driver("naming a device"))?;
        let uuid = result::device::get_uuid(dev).map_err(driver("reading a device's UUID"))?;
        let bytes: [u8; 16] = std::array::from_fn(|i| uuid.bytes[i] as u8);
        let attribute = |a| {
            // SAFETY: `dev` is a device the driver just returned.
            unsafe { result::device::get_attribute(dev, a) }
                .map_err(driver("reading a device's capability"))
        };
        let major =
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor =
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        // SAFETY: as above.
        let memory = unsafe { result::device::total_mem(dev) }
            .map_err(driver("reading a device's memory"))?;
        out.push(DeviceInfo {
            ordinal: ordinal as usize,
            uuid: uuid_text(&bytes),
            name,
            cc: (major.clamp(0, 255) as u8, minor.clamp(0, 255) as u8),
            memory_bytes: memory as u64,
        });
    }
    Ok(out)
}

/// Threads per block in every launch.
const THREADS: u32 = 256;

fn grid(threads: u64) -> Result<LaunchConfig, GpuError> {
    let blocks = threads.div_ceil(u64::from(THREADS)).max(1);
    let blocks = u32::try_from(blocks)
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| GpuError::Memory(format!("{threads} threads is more than one launch")))?;
    Ok(LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Launches a kernel over `threads` threads.
fn run(mut launch: LaunchArgs<'_>, threads: u64, what: &'static str) -> Result<(), GpuError> {
    let config = grid(threads)?;
    // SAFETY: every caller passes the kernel's arguments in the order and types of its
    // CUDA signature (attestation/cuda/challenge.cu), on buffers holding what the kernel
    // reads and writes for `threads` threads (each kernel returns past its own bound).
    unsafe { launch.launch(config) }.map_err(driver(what))?;
    Ok(())
}

/// The challenge's kernels, loaded.
struct Kernels {
    gen_a: CudaFunction,
    gen_bt: CudaFunction,
    product: CudaFunction,
    fill_slice: CudaFunction,
    hash_row_chunks: CudaFunction,
    hash_rows: CudaFunction,
    hash_blocks: CudaFunction,
    merkle_level: CudaFunction,
}

/// A GPU with the challenge's kernels loaded.
pub struct Device {
    /// What the driver says of it.
    pub info: DeviceInfo,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    k: Arc<Kernels>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("info", &self.info).finish()
    }
}

/// Bytes the product's passes hold at once (rows of `A`, of `C` and their chunks' chaining
/// values), besides `B`.
const PASS_BYTES: u64 = 512 << 20;

/// Rows per pass of the product: a multiple of 64 (whole tensor-core tiles) within
/// [`PASS_BYTES`], at most `m`.
fn rows_per_pass(shape: Shape) -> u64 {
    let (k, n) = (u64::from(shape.k), u64::from(shape.n));
    let per_row = k + 4 * n + 32 * (4 * n).div_ceil(1024);
    (PASS_BYTES / per_row / 64 * 64).clamp(64, u64::from(shape.m))
}

fn words_of(hash: &Hash) -> [u32; 8] {
    std::array::from_fn(|i| {
        u32::from_le_bytes([
            hash[4 * i],
            hash[4 * i + 1],
            hash[4 * i + 2],
            hash[4 * i + 3],
        ])
    })
}

fn hash_of(words: &[u32]) -> Hash {
    let mut h = [0u8; 32];
    for (out, w) in h.chunks_exact_mut(4).zip(words) {
        out.copy_from_slice(&w.to_le_bytes());
    }
    h
}

/// A Merkle tree's levels on the GPU (8 words a node), leaves first, and their lengths.
struct Levels {
    levels: Vec<(CudaSlice<u32>, usize)>,
}

impl Device {
    /// The device with `uuid` (NVML's form), its kernels loaded (the driver compiles the PTX
    /// for it here: call before any clock starts).
    pub fn open(uuid: &str) -> Result<Device, GpuError> {
        let info = devices()?
            .into_iter()
            .find(|d| d.uuid.eq_ignore_ascii_case(uuid))
            .ok_or_else(|| GpuError::NoDevice(uuid.to_string()))?;
        let ptx = cuda::ptx_for(info.cc).ok_or_else(|| GpuError::TooOld {
            name: info.name.clone(),
            major: info.cc.0,
            minor: info.cc.1,
        })?;
        let ctx = CudaContext::new(info.ordinal).map_err(driver("opening the device"))?;
        let module = ctx
            .load_module(Ptx::from_src(ptx))
            .map_err(driver("loading the challenge's kernels"))?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(driver("finding a kernel"))
        };
        let k = Kernels {
            gen_a: f("gen_a")?,
            gen_bt: f("gen_bt")?,
            product: f("product")?,
            fill_slice: f("fill_slice")?,
            hash_row_chunks: f("hash_row_chunks")?,
            hash_rows: f("hash_rows")?,
            hash_blocks: f("hash_blocks")?,
            merkle_level: f("merkle_level")?,
        };
        let stream = ctx.default_stream();
        Ok(Device {
            info,
            ctx,
            stream,
            k: Arc::new(k),
        })
    }

    /// `len` elements on the device from `make`, or why they do not fit.
    fn allocated<T>(
        &self,
        len: u64,
        what: &str,
        make: impl FnOnce(usize) -> Result<CudaSlice<T>, DriverError>,
    ) -> Result<CudaSlice<T>, GpuError> {
        let len = usize::try_from(len)
            .map_err(|_| GpuError::Memory(format!("{what}: {len} elements")))?
            .max(1);
        make(len).map_err(|e| {
            GpuError::Memory(format!(
                "{what} ({} MiB) does not fit {}: {e}",
                (len * std::mem::size_of::<T>()) >> 20,
                self.info.name
            ))
        })
    }

    /// `len` cleared elements.
    fn alloc<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        len: u64,
        what: &str,
    ) -> Result<CudaSlice<T>, GpuError> {
        self.allocated(len, what, |n| self.stream.alloc_zeros::<T>(n))
    }

    /// Memory the kernels write in full before anything reads it (the fill, the leaves):
    /// not cleared first, which would cost the fill a third of its time.
    fn alloc_written<T: cudarc::driver::DeviceRepr>(
        &self,
        len: u64,
        what: &str,
    ) -> Result<CudaSlice<T>, GpuError> {
        // SAFETY: the caller's kernel writes every element before any is read.
        self.allocated(len, what, |n| unsafe { self.stream.alloc::<T>(n) })
    }

    fn key_on_device(&self, context: &str) -> Result<CudaSlice<u32>, GpuError> {
        self.stream
            .clone_htod(&cuda::context_key(context))
            .map_err(driver("copying a key"))
    }

    /// The free memory of the device, bytes.
    pub fn free_bytes(&self) -> Result<u64, GpuError> {
        let (free, _) = self
            .ctx
            .mem_get_info()
            .map_err(driver("reading free memory"))?;
        Ok(free as u64)
    }

    /// The Merkle levels above `leaves` (`count` of them) on the GPU.
    fn merkle(&self, leaves: CudaSlice<u32>, count: usize) -> Result<Levels, GpuError> {
        let depth = merkle::depth(count);
        let pads = merkle::pads(depth);
        let key = self.key_on_device(merkle::NODE_CONTEXT)?;
        let mut levels = vec![(leaves, count)];
        for pad in pads.iter().take(depth) {
            let pad = self
                .stream
                .clone_htod(&words_of(pad))
                .map_err(driver("copying a pad"))?;
            let (below, below_count) = &levels[levels.len() - 1];
            let count = below_count.div_ceil(2);
            let mut above = self.alloc::<u32>(8 * count as u64, "a Merkle level")?;
            let mut launch = self.stream.launch_builder(&self.k.merkle_level);
            let below_count = *below_count as u64;
            launch
                .arg(below)
                .arg(&below_count)
                .arg(&pad)
                .arg(&key)
                .arg(&mut above);
            run(launch, count as u64, "a Merkle level")?;
            levels.push((above, count));
        }
        Ok(Levels { levels })
    }

    fn node(&self, levels: &Levels, level: usize, i: usize) -> Result<Option<Hash>, GpuError> {
        let Some((nodes, count)) = levels.levels.get(level) else {
            return Ok(None);
        };
        if i >= *count {
            return Ok(None);
        }
        let words = self
            .stream
            .clone_dtoh(&nodes.slice(8 * i..8 * i + 8))
            .map_err(driver("reading a node"))?;
        Ok(Some(hash_of(&words)))
    }

    fn root(&self, levels: &Levels) -> Result<Hash, GpuError> {
        let top = levels.levels.len() - 1;
        Ok(self.node(levels, top, 0)?.unwrap_or([0; 32]))
    }

    fn path(&self, levels: &Levels, index: usize) -> Result<Vec<Hash>, GpuError> {
        let depth = levels.levels.len() - 1;
        let mut failed = None;
        let path = merkle::path_with(depth, index, |level, i| {
            self.node(levels, level, i).unwrap_or_else(|e| {
                failed.get_or_insert(e);
                None
            })
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(path),
        }
    }

    /// Generates `rows` rows of `A` from row `first` into `a` (from its start).
    fn gen_a(
        &self,
        a: &mut CudaSlice<i8>,
        at: u64,
        key: u64,
        shape: Shape,
        first: u64,
        rows: u64,
    ) -> Result<(), GpuError> {
        let k = u64::from(shape.k);
        let first_word = first * k / 8;
        let entries = rows * k;
        let mut view = a.slice_mut(at as usize..(at + entries) as usize);
        let mut launch = self.stream.launch_builder(&self.k.gen_a);
        launch
            .arg(&mut view)
            .arg(&key)
            .arg(&first_word)
            .arg(&entries);
        run(launch, entries / 8, "generating A")?;
        Ok(())
    }

    /// `C = A·B` for `rows` rows (a multiple of 64) on the tensor cores.
    fn product(
        &self,
        a: &CudaSlice<i8>,
        bt: &CudaSlice<i8>,
        c: &mut CudaSlice<i32>,
        rows: u64,
        shape: Shape,
    ) -> Result<(), GpuError> {
        let (m, n, k) = (rows as u32, shape.n, shape.k);
        let warps = u64::from(m / 16) * u64::from(n / 16);
        let mut launch = self.stream.launch_builder(&self.k.product);
        launch.arg(a).arg(bt).arg(c).arg(&m).arg(&n).arg(&k);
        run(launch, warps * 32, "the product")?;
        Ok(())
    }

    /// Proves the product of `shape` for `seed`: every row computed and hashed, the root
    /// committed. Blocks until the GPU is done.
    pub fn prove(&self, seed: &[u8; 32], shape: Shape) -> Result<GpuProduct<'_>, GpuError> {
        let started = Instant::now();
        let (m, k, n) = (u64::from(shape.m), u64::from(shape.k), u64::from(shape.n));
        let key_a = tensor::key(seed, shape, tensor::Which::A);
        let key_b = tensor::key(seed, shape, tensor::Which::B);
        let mut bt = self.alloc::<i8>(k * n, "B")?;
        {
            let (k32, n32) = (shape.k, shape.n);
            let mut launch = self.stream.launch_builder(&self.k.gen_bt);
            launch.arg(&mut bt).arg(&key_b).arg(&k32).arg(&n32);
            run(launch, k * n, "generating B")?;
        }
        let per_pass = rows_per_pass(shape);
        let chunks = (4 * n).div_ceil(1024);
        let mut a = self.alloc::<i8>(per_pass * k, "a pass of A")?;
        let mut c = self.alloc::<i32>(per_pass * n, "a pass of the product")?;
        let mut cvs = self.alloc::<u32>(per_pass * chunks * 8, "a pass's chunk hashes")?;
        let mut leaves = self.alloc::<u32>(m * 8, "the row hashes")?;
        let key_row = self.key_on_device(tensor::ROW_CONTEXT)?;
        let n32 = shape.n;
        let mut first = 0u64;
        while first < m {
            let rows = per_pass.min(m - first);
            self.gen_a(&mut a, 0, key_a, shape, first, rows)?;
            self.product(&a, &bt, &mut c, rows, shape)?;
            let rows32 = rows as u32;
            let mut launch = self.stream.launch_builder(&self.k.hash_row_chunks);
            launch
                .arg(&c)
                .arg(&rows32)
                .arg(&n32)
                .arg(&key_row)
                .arg(&mut cvs);
            run(launch, rows * chunks, "hashing chunks")?;
            let mut launch = self.stream.launch_builder(&self.k.hash_rows);
            launch
                .arg(&cvs)
                .arg(&rows32)
                .arg(&n32)
                .arg(&key_row)
                .arg(&mut leaves)
                .arg(&first);
            run(launch, rows, "hashing rows")?;
            first += rows;
        }
        drop((a, c, cvs));
        let levels = self.merkle(leaves, m as usize)?;
        let root = self.root(&levels)?;
        Ok(GpuProduct {
            device: self,
            shape,
            root,
            elapsed: started.elapsed(),
            key_a,
            bt,
            levels,
        })
    }

    /// Fills `shape` for `seed` (all of it held), hashes every block and commits the root.
    /// Blocks until the GPU is done.
    pub fn fill(&self, seed: &[u8; 32], shape: FillShape) -> Result<GpuFill<'_>, GpuError> {
        let started = Instant::now();
        let count = u64::from(shape.lanes) * u64::from(shape.blocks);
        // The fill, its leaves and the levels above them (as many again), and room for the
        // product's passes after it.
        let needs = shape.bytes() + 2 * 32 * count + PASS_BYTES + (256 << 20);
        let free = self.free_bytes()?;
        if needs > free {
            return Err(GpuError::Memory(format!(
                "a fill of {:.1} GB with its hashes needs {:.1} GB; {} has {:.1} GB free",
                shape.bytes() as f64 / 1e9,
                needs as f64 / 1e9,
                self.info.name,
                free as f64 / 1e9
            )));
        }
        let mut mem = self.alloc_written::<u64>(count * BLOCK_WORDS as u64, "the fill")?;
        let key = fill::key(seed, shape);
        let (lanes, blocks) = (shape.lanes, shape.blocks);
        let slice_len = blocks / fill::SLICES;
        for slice in 0..fill::SLICES {
            let start = slice * slice_len;
            let mut launch = self.stream.launch_builder(&self.k.fill_slice);
            launch
                .arg(&mut mem)
                .arg(&key)
                .arg(&lanes)
                .arg(&blocks)
                .arg(&start)
                .arg(&blocks);
            run(launch, u64::from(lanes) * 32, "a slice of the fill")?;
        }
        let mut leaves = self.alloc_written::<u32>(count * 8, "the block hashes")?;
        let key_block = self.key_on_device(fill::BLOCK_CONTEXT)?;
        let mut launch = self.stream.launch_builder(&self.k.hash_blocks);
        launch
            .arg(&mem)
            .arg(&count)
            .arg(&key_block)
            .arg(&mut leaves);
        run(launch, count, "hashing blocks")?;
        let levels = self.merkle(leaves, count as usize)?;
        let root = self.root(&levels)?;
        Ok(GpuFill {
            device: self,
            shape,
            root,
            elapsed: started.elapsed(),
            mem,
            levels,
        })
    }
}

/// A product proved on the GPU: the root, and what opens rows.
pub struct GpuProduct<'d> {
    device: &'d Device,
    /// The challenge's shape.
    pub shape: Shape,
    /// The Merkle root over the row hashes.
    pub root: Hash,
    /// What the product, the hashes and the levels took.
    pub elapsed: Duration,
    key_a: u64,
    bt: CudaSlice<i8>,
    levels: Levels,
}

impl GpuProduct<'_> {
    /// Opens `rows` (each below `m`; others are skipped): recomputed on the GPU, with their
    /// paths.
    pub fn open(&self, rows: &[u32]) -> Result<Vec<Opened>, GpuError> {
        let d = self.device;
        let shape = self.shape;
        let picks: Vec<u32> = rows.iter().copied().filter(|&i| i < shape.m).collect();
        let (k, n) = (u64::from(shape.k), u64::from(shape.n));
        let padded = (picks.len() as u64).div_ceil(64).max(1) * 64;
        let mut a = d.alloc::<i8>(padded * k, "the picked rows of A")?;
        for (slot, &i) in picks.iter().enumerate() {
            d.gen_a(&mut a, slot as u64 * k, self.key_a, shape, u64::from(i), 1)?;
        }
        let mut c = d.alloc::<i32>(padded * n, "the picked rows")?;
        d.product(&a, &self.bt, &mut c, padded, shape)?;
        let values = d
            .stream
            .clone_dtoh(&c)
            .map_err(driver("reading the picked rows"))?;
        picks
            .iter()
            .enumerate()
            .map(|(slot, &i)| {
                Ok(Opened {
                    index: i,
                    row: values[slot * n as usize..(slot + 1) * n as usize].to_vec(),
                    path: d.path(&self.levels, i as usize)?,
                })
            })
            .collect()
    }
}

/// A fill on the GPU: the root, and the memory and levels that open blocks.
pub struct GpuFill<'d> {
    device: &'d Device,
    /// The fill's shape.
    pub shape: FillShape,
    /// The Merkle root over every block's hash, lane by lane.
    pub root: Hash,
    /// What the fill, the hashes and the levels took.
    pub elapsed: Duration,
    mem: CudaSlice<u64>,
    levels: Levels,
}

impl GpuFill<'_> {
    fn block(&self, lane: u32, index: u32) -> Result<OpenedBlock, GpuError> {
        let leaf = lane as usize * self.shape.blocks as usize + index as usize;
        let words = self
            .device
            .stream
            .clone_dtoh(&self.mem.slice(leaf * BLOCK_WORDS..(leaf + 1) * BLOCK_WORDS))
            .map_err(driver("reading a block"))?;
        let mut block: Block = [0; BLOCK_WORDS];
        block.copy_from_slice(&words);
        Ok(OpenedBlock {
            lane,
            index,
            block,
            path: self.device.path(&self.levels, leaf)?,
        })
    }

    /// Opens each picked block with its predecessor and its reference (picks outside the
    /// shape are skipped), as [`fill::Filled::open`].
    pub fn open(&self, picks: &[(u32, u32)]) -> Result<Vec<Opening>, GpuError> {
        picks
            .iter()
            .filter(|(lane, j)| *lane < self.shape.lanes && (2..self.shape.blocks).contains(j))
            .map(|&(lane, j)| {
                let prev = self.block(lane, j - 1)?;
                let (rl, ri) = fill::reference(self.shape, lane, j, &prev.block);
                Ok([self.block(lane, j)?, prev, self.block(rl, ri)?])
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_read_as_nvml_writes_them() {
        let bytes: [u8; 16] = std::array::from_fn(|i| (i * 17) as u8);
        assert_eq!(
            uuid_text(&bytes),
            "GPU-00112233-4455-6677-8899-aabbccddeeff"
        );
    }

    #[test]
    fn passes_are_whole_tiles_within_their_budget() {
        for shape in [
            Shape::new(64, 1024, 256).unwrap(),
            Shape::new(1_843_136, 32_768, 8_192).unwrap(),
            Shape::new(4_096, 8_192, 2_048).unwrap(),
        ] {
            let rows = rows_per_pass(shape);
            assert!(rows.is_multiple_of(64) && rows <= u64::from(shape.m));
            assert!(rows * (u64::from(shape.k) + 4 * u64::from(shape.n)) <= PASS_BYTES);
        }
    }

    #[test]
    fn hashes_cross_as_words_and_back() {
        let h = *blake3::hash(b"x").as_bytes();
        assert_eq!(hash_of(&words_of(&h)), h);
    }

    /// Without the NVIDIA driver (CI's machine) the prover says so and nothing panics;
    /// with it (a GPU machine), it lists the devices and finds no made-up one.
    #[test]
    fn the_prover_finds_the_driver_or_says_it_is_missing() {
        let e = Device::open("GPU-00000000-0000-0000-0000-000000000000").unwrap_err();
        if driver_present() {
            assert!(devices().is_ok());
            assert!(matches!(e, GpuError::NoDevice(_)), "{e}");
        } else {
            assert!(matches!(devices(), Err(GpuError::NoDriver)));
            assert!(e.to_string().contains("libcuda.so"), "{e}");
        }
    }
}

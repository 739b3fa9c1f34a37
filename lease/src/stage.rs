//! A renter's image staged on a host (`/gpux/stage/1`), host side, as a pure machine: which
//! layers it takes and from where, and the checks each must pass before the image is loaded
//! and held for the renter. The node's shell receives the bytes, writes the tar that
//! `docker load` reads as they arrive, and reports the digests it computed; the machine
//! says what comes next.
//!
//! The rule it keeps: **a staged image is never used before it is verified.** The tar is
//! completed (so Docker loads it) only once the config is the image's own and every layer
//! in it verified: the blake3 the renter announced over every byte that arrived (what
//! arrived damaged is dropped, not kept for a retry), and, for a layer the store has only
//! through another renter's image (which `docker load` would skip unread), its sha256
//! against the diff id it claims, so a renter proves it has a layer's bytes, not just its
//! id. The image is held for the renter (and so runs in its leases) only once Docker has
//! it under the id staged (`lease/tests/stage.rs`).

/// A layer the renter announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageLayerSpec {
    /// Its sha256 diff id (what Docker names it by).
    pub diff_id: [u8; 32],
    /// The blake3 of its bytes.
    pub blake3: [u8; 32],
    /// Its size.
    pub bytes: u64,
}

/// Where the host's Docker has a layer (with the chain of the layers below it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerStored {
    /// Through this renter's images or the host's own: not loaded again.
    Yes,
    /// Only through another renter's image: loaded, and its sha256 checked here.
    Foreign,
    /// Not at all.
    No,
}

/// What an earlier staging of the image left on the host's disk for a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerOnDisk {
    /// The whole layer, verified when it arrived.
    Whole,
    /// This many bytes of it (not yet verified).
    Part(u64),
    /// Nothing.
    Nothing,
}

/// What the shell reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageInput {
    /// The config arrived: its sha256 (the image id) and the diff ids it lists.
    Config {
        /// The sha256 of its bytes.
        id: [u8; 32],
        /// The layers it lists.
        diff_ids: Vec<[u8; 32]>,
    },
    /// The layer asked for is written into the tar: the digests computed over its bytes
    /// (the blake3 when it was received, the sha256 when it was to be checked).
    Layer {
        /// The blake3 over the whole layer (what was on disk and what arrived).
        blake3: Option<[u8; 32]>,
        /// The sha256 over the whole layer.
        sha256: Option<[u8; 32]>,
    },
    /// Docker finished loading: whether it has the image under the id staged.
    Loaded(bool),
}

/// What the shell does, without an answer, before the next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageSide {
    /// Layer `i`'s bytes verified: keep them whole for a later staging.
    Keep(usize),
    /// Layer `i`'s bytes arrived damaged: drop what was kept of them.
    Drop(usize),
}

/// What the machine waits for next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageNext {
    /// The config ([`StageInput::Config`]).
    Config,
    /// Layer `index` written into the tar ([`StageInput::Layer`]).
    Layer {
        /// The layer.
        index: usize,
        /// Received from this byte on, after what is on disk (none: all from its whole
        /// file).
        from: Option<u64>,
        /// Its sha256 is checked.
        sha256: bool,
    },
    /// The tar completed and loaded ([`StageInput::Loaded`]).
    Finish,
    /// The staging is over: the image is held for the renter, or why not (the tar, if
    /// started, is cut off unfinished, so Docker loads nothing).
    Done(Result<(), String>),
}

/// One step: what to do now, then what to wait for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageStep {
    /// Done first, in order.
    pub side: Vec<StageSide>,
    /// Then waited for.
    pub next: StageNext,
}

/// How one layer is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Take {
    index: usize,
    /// Received from this byte on (none: from its whole file).
    from: Option<u64>,
    sha256: bool,
}

/// One staging of an image on the host.
#[derive(Debug, Clone)]
pub struct StageCheck {
    image: [u8; 32],
    layers: Vec<StageLayerSpec>,
    /// The layers loaded, in order.
    takes: Vec<Take>,
    /// The next of `takes` to write.
    at: usize,
    waiting: StageNext,
}

impl StageCheck {
    /// A staging of image `image` (its config's sha256) with `layers`, each stored and on
    /// disk as `found` says.
    pub fn new(
        image: [u8; 32],
        layers: Vec<StageLayerSpec>,
        found: &[(LayerStored, LayerOnDisk)],
    ) -> (Self, StageStep) {
        let takes = layers
            .iter()
            .zip(found)
            .enumerate()
            .filter(|(_, (_, (stored, _)))| *stored != LayerStored::Yes)
            .map(|(index, (layer, (stored, on_disk)))| Take {
                index,
                from: match *on_disk {
                    LayerOnDisk::Whole => None,
                    LayerOnDisk::Part(part) if part <= layer.bytes => Some(part),
                    LayerOnDisk::Part(_) | LayerOnDisk::Nothing => Some(0),
                },
                // With the `broken-rule` feature a layer known only through another
                // renter's image is not checked: the simulator must see a renter given a
                // layer it does not have (`lease/tests/stage.rs`).
                sha256: *stored == LayerStored::Foreign && !cfg!(feature = "broken-rule"),
            })
            .collect();
        let mut check = Self {
            image,
            layers,
            takes,
            at: 0,
            waiting: StageNext::Config,
        };
        let step = check.step(Vec::new(), StageNext::Config);
        (check, step)
    }

    /// The layers to receive, each from which byte.
    pub fn needs(&self) -> Vec<(usize, u64)> {
        self.takes
            .iter()
            .filter_map(|t| t.from.map(|from| (t.index, from)))
            .collect()
    }

    /// The layer bytes still to arrive.
    pub fn incoming_bytes(&self) -> u64 {
        self.takes
            .iter()
            .filter_map(|t| t.from.map(|from| self.layers[t.index].bytes - from))
            .sum()
    }

    /// The layers in the tar, by index, in order.
    pub fn loaded(&self) -> Vec<usize> {
        self.takes.iter().map(|t| t.index).collect()
    }

    /// What the machine waits for.
    pub fn waiting(&self) -> &StageNext {
        &self.waiting
    }

    /// Handles the input the machine waits for. An input it is not waiting for changes
    /// nothing: the step returned is the one it waits on still.
    pub fn handle(&mut self, input: StageInput) -> StageStep {
        let mut side = Vec::new();
        let next = match (self.waiting.clone(), input) {
            (StageNext::Config, StageInput::Config { id, diff_ids }) => {
                let declared: Vec<[u8; 32]> = self.layers.iter().map(|l| l.diff_id).collect();
                if id != self.image {
                    StageNext::Done(Err(
                        "the config is not the image's (its sha256 differs)".into()
                    ))
                } else if diff_ids != declared {
                    StageNext::Done(Err("the config lists other layers than announced".into()))
                } else {
                    self.next_layer()
                }
            }
            (StageNext::Layer { index, from, .. }, StageInput::Layer { blake3, sha256 }) => {
                let take = self.takes[self.at];
                let layer = self.layers[index];
                let hex = gpux_protocol::hex(&layer.diff_id);
                if from.is_some() && blake3 != Some(layer.blake3) {
                    side.push(StageSide::Drop(index));
                    StageNext::Done(Err(format!(
                        "layer sha256:{hex} arrived damaged (its blake3 differs); it was dropped"
                    )))
                } else {
                    if from.is_some() {
                        side.push(StageSide::Keep(index));
                    }
                    if take.sha256 && sha256 != Some(layer.diff_id) {
                        StageNext::Done(Err(format!(
                            "layer {index} is not the layer its diff id names (its sha256 differs)"
                        )))
                    } else {
                        self.at += 1;
                        self.next_layer()
                    }
                }
            }
            (StageNext::Finish, StageInput::Loaded(present)) => StageNext::Done(if present {
                Ok(())
            } else {
                Err(format!(
                    "Docker loaded something, but not image sha256:{}",
                    gpux_protocol::hex(&self.image)
                ))
            }),
            (waiting, _) => waiting,
        };
        self.step(side, next)
    }

    fn next_layer(&self) -> StageNext {
        match self.takes.get(self.at) {
            Some(take) => StageNext::Layer {
                index: take.index,
                from: take.from,
                sha256: take.sha256,
            },
            None => StageNext::Finish,
        }
    }

    fn step(&mut self, side: Vec<StageSide>, next: StageNext) -> StageStep {
        self.waiting = next.clone();
        StageStep { side, next }
    }
}

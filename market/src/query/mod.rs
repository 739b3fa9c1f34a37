//! The market query language, used by `gpux offers search` and by bids.
//!
//! ```text
//! gpu=H100 vram>=80 count>=2 price<=2.5 region=eu cc>=9.0 tier>=challenged spot=false
//! gpu in [h100,a100] region notin [us] order=price,reliability-
//! ```
//!
//! A query is clauses separated by spaces, all of which must hold. A clause is
//! `FIELD OP VALUE` with `OP` one of `= != < <= > >=`, or `FIELD in [V,...]` /
//! `FIELD notin [V,...]`. `order=KEY[-],...` sets the result order (`-` for descending).
//! Field names are case-insensitive. See `docs/query.md` for every field.

mod lexer;
mod parser;

use std::fmt;

use gpux_protocol::{GpuFamily, ImageDigest, PublicKey};

pub use lexer::CompareOp;
pub use parser::parse;
pub(crate) use parser::{cc_key, tier_key, version_key};

/// The longest query accepted, in bytes (the same limit as a bid's query on the wire).
pub const MAX_QUERY_BYTES: usize = gpux_protocol::MAX_QUERY_BYTES;
/// The most clauses in one query.
pub const MAX_CLAUSES: usize = 32;
/// The most values in one list.
pub const MAX_LIST_VALUES: usize = 64;

/// A field a clause can test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Field {
    /// GPU family or model name (`H100`, `NVIDIA H100 80GB HBM3`, `a10g`).
    Gpu,
    /// Memory per GPU, GB as makers print it.
    Vram,
    /// Free GPUs in one offer.
    Count,
    /// Price per GPU-hour, credits.
    Price,
    /// CUDA compute capability.
    Cc,
    /// Maximum PCIe generation.
    PcieGen,
    /// Host region; `region=eu` also matches `eu-west`.
    Region,
    /// Host reliability, 0 to 1, as this node has observed it.
    Reliability,
    /// Evidence tier (`self-reported` < `challenged` < `cc-attested`).
    Tier,
    /// Whether the offer takes spot leases.
    Spot,
    /// The host: public key (hex) or peer id.
    Host,
    /// NVIDIA driver version.
    Driver,
    /// CUDA version the driver supports.
    Cuda,
    /// An image the host has: its digest (`sha256:...`), a tag it lists (`pytorch:2.4`,
    /// `pytorch*`) or an image in its pull cache (`pytorch/pytorch:2.5*`).
    Image,
    /// The largest workspace the host gives a lease now, GB (10^9 bytes).
    Disk,
    /// The largest renter image the host stages, GB (10^9 bytes; 0: it stages none).
    Stage,
    /// What a workspace kept after its workload costs, credits per GiB-hour (0: free).
    DiskPrice,
    /// Whether the offer lists MIG instances (slices of a GPU) rather than whole GPUs.
    Mig,
    /// CPU cores that go with each GPU (thousandths on the query scale).
    Cpu,
    /// Memory that goes with each GPU, GB (10^9 bytes).
    Ram,
    /// The workspace disk's measured write speed, MB/s.
    DiskSpeed,
    /// The host's measured upload bandwidth, Mbit/s.
    InetUp,
    /// The host's measured download bandwidth, Mbit/s.
    InetDown,
    /// The largest image the host pulls from a registry, GB (10^9 bytes; 0: none).
    Pull,
}

impl Field {
    /// Every field, with its name.
    pub const ALL: [(Field, &'static str); 24] = [
        (Field::Gpu, "gpu"),
        (Field::Vram, "vram"),
        (Field::Count, "count"),
        (Field::Price, "price"),
        (Field::Cc, "cc"),
        (Field::PcieGen, "pcie_gen"),
        (Field::Region, "region"),
        (Field::Reliability, "reliability"),
        (Field::Tier, "tier"),
        (Field::Spot, "spot"),
        (Field::Host, "host"),
        (Field::Driver, "driver"),
        (Field::Cuda, "cuda"),
        (Field::Image, "image"),
        (Field::Disk, "disk"),
        (Field::Stage, "stage"),
        (Field::DiskPrice, "disk_price"),
        (Field::Mig, "mig"),
        (Field::Cpu, "cpu"),
        (Field::Ram, "ram"),
        (Field::DiskSpeed, "disk_speed"),
        (Field::InetUp, "inet_up"),
        (Field::InetDown, "inet_down"),
        (Field::Pull, "pull"),
    ];

    /// The field's name in queries.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(f, _)| *f == self)
            .map_or("?", |(_, n)| n)
    }

    /// Whether `<`, `<=`, `>`, `>=` make sense for the field.
    pub fn is_ordered(self) -> bool {
        !matches!(
            self,
            Field::Gpu | Field::Region | Field::Spot | Field::Host | Field::Image | Field::Mig
        )
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A key results can be ordered by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrderKey {
    /// Price per GPU-hour.
    Price,
    /// Host reliability.
    Reliability,
    /// Memory per GPU.
    Vram,
    /// Free GPUs.
    Count,
    /// Compute capability.
    Cc,
    /// PCIe generation.
    PcieGen,
    /// Evidence tier.
    Tier,
    /// Offer age (`created_at`; ascending = oldest first).
    Age,
    /// Driver version.
    Driver,
    /// CUDA version.
    Cuda,
    /// CPU that goes with each GPU.
    Cpu,
    /// Memory that goes with each GPU.
    Ram,
    /// The workspace disk's write speed.
    DiskSpeed,
    /// Upload bandwidth.
    InetUp,
    /// Download bandwidth.
    InetDown,
}

impl OrderKey {
    /// Every key, with its name.
    pub const ALL: [(OrderKey, &'static str); 15] = [
        (OrderKey::Price, "price"),
        (OrderKey::Reliability, "reliability"),
        (OrderKey::Vram, "vram"),
        (OrderKey::Count, "count"),
        (OrderKey::Cc, "cc"),
        (OrderKey::PcieGen, "pcie_gen"),
        (OrderKey::Tier, "tier"),
        (OrderKey::Age, "age"),
        (OrderKey::Driver, "driver"),
        (OrderKey::Cuda, "cuda"),
        (OrderKey::Cpu, "cpu"),
        (OrderKey::Ram, "ram"),
        (OrderKey::DiskSpeed, "disk_speed"),
        (OrderKey::InetUp, "inet_up"),
        (OrderKey::InetDown, "inet_down"),
    ];
}

/// One ordering key and its direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ordering {
    /// The key.
    pub key: OrderKey,
    /// Descending when true.
    pub descending: bool,
}

/// A parsed value. Ordered fields are normalised to one integer scale each (see
/// [`Value::Number`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A GPU family.
    Family(GpuFamily),
    /// An ordered value on its field's scale: GB for vram and ram, micro-credits for price,
    /// `major * 100 + minor` for cc, thousandths for reliability and cpu, the tier's rank,
    /// `major << 32 | minor << 16 | patch` for versions, plain integers otherwise.
    Number(u64),
    /// A region (lower case).
    Region(String),
    /// A yes/no value.
    Bool(bool),
    /// A host key.
    Host(PublicKey),
    /// An image digest.
    Image(ImageDigest),
    /// An image tag the host lists (`pytorch:2.4`), or a prefix of one (`pytorch*`).
    ImageTag(String),
}

/// Whether a host's listed `tag` matches `pattern`: equal, `name` for `name:latest` as
/// Docker reads it, or a prefix when the pattern ends with `*`.
pub fn tag_matches(pattern: &str, tag: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => tag.starts_with(prefix),
        None => {
            tag == pattern
                || (!pattern.contains(':') && tag.strip_suffix(":latest") == Some(pattern))
        }
    }
}

/// One clause: `field op values` (one value unless the operator is `in` / `notin`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clause {
    /// The field.
    pub field: Field,
    /// The operator.
    pub op: CompareOp,
    /// The values.
    pub values: Vec<Value>,
    /// Where the clause starts (1-based column).
    pub column: usize,
}

/// A parsed query: clauses that must all hold, and an optional order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Query {
    /// The clauses.
    pub clauses: Vec<Clause>,
    /// The order requested, empty for the default (price, then reliability descending,
    /// then age).
    pub order: Vec<Ordering>,
}

impl Query {
    /// Parses query text. See the [module docs](self).
    pub fn parse(text: &str) -> Result<Query, QueryError> {
        parse(text)
    }

    /// The default order: price ascending, reliability descending, oldest first.
    pub const DEFAULT_ORDER: [Ordering; 3] = [
        Ordering {
            key: OrderKey::Price,
            descending: false,
        },
        Ordering {
            key: OrderKey::Reliability,
            descending: true,
        },
        Ordering {
            key: OrderKey::Age,
            descending: false,
        },
    ];

    /// The families the query limits itself to (`gpu=h100`, `gpu in [h100, a100]`; several
    /// such clauses intersect), or `None` when it matches any family.
    pub fn families(&self) -> Option<std::collections::BTreeSet<GpuFamily>> {
        let mut limit: Option<std::collections::BTreeSet<GpuFamily>> = None;
        for clause in &self.clauses {
            if clause.field != Field::Gpu || !matches!(clause.op, CompareOp::Eq | CompareOp::In) {
                continue;
            }
            let named: std::collections::BTreeSet<GpuFamily> = clause
                .values
                .iter()
                .filter_map(|v| match v {
                    Value::Family(f) => Some(*f),
                    _ => None,
                })
                .collect();
            limit = Some(match limit {
                Some(l) => l.intersection(&named).copied().collect(),
                None => named,
            });
        }
        limit
    }

    /// The order to use: the requested one, completed by the default keys it does not name.
    pub fn effective_order(&self) -> Vec<Ordering> {
        let mut order = self.order.clone();
        for d in Self::DEFAULT_ORDER {
            if !order.iter().any(|o| o.key == d.key) {
                order.push(d);
            }
        }
        order
    }
}

/// A query that could not be parsed, with the column where the problem is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryError {
    /// 1-based column (in characters).
    pub column: usize,
    /// What is wrong.
    pub kind: QueryErrorKind,
}

/// What is wrong with a query.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum QueryErrorKind {
    /// A character that cannot start any token.
    UnexpectedChar(char),
    /// A field name that does not exist.
    UnknownField {
        /// The name given.
        name: String,
        /// The closest field, if any is close.
        suggestion: Option<&'static str>,
    },
    /// A field not followed by an operator.
    ExpectedOperator {
        /// The field.
        field: String,
    },
    /// An operator not followed by a value.
    ExpectedValue {
        /// The field.
        field: Field,
    },
    /// A value that does not fit the field.
    BadValue {
        /// The field.
        field: Field,
        /// The value given.
        value: String,
        /// What the field takes.
        expected: &'static str,
    },
    /// A GPU name not in the family table.
    UnknownGpu {
        /// The name given.
        name: String,
        /// The closest family key or alias, if any is close.
        suggestion: Option<&'static str>,
    },
    /// An ordering operator on an unordered field.
    OperatorNotAllowed {
        /// The field.
        field: Field,
        /// The operator.
        op: CompareOp,
    },
    /// `in` / `notin` not followed by `[`.
    ExpectedList,
    /// A list without its `]`.
    UnterminatedList,
    /// `[]`.
    EmptyList,
    /// A token where a field name was expected.
    UnexpectedToken(String),
    /// `order=` not followed by a key.
    ExpectedOrderKey,
    /// An `order=` key that does not exist.
    UnknownOrderKey {
        /// The key given.
        name: String,
        /// The closest key, if any is close.
        suggestion: Option<&'static str>,
    },
    /// The query text is too long.
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// Too many clauses or list values.
    TooMany {
        /// What there are too many of.
        what: &'static str,
        /// The limit.
        max: usize,
    },
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let col = self.column;
        let suggest = |f: &mut fmt::Formatter<'_>, s: &Option<&str>| match s {
            Some(s) => write!(f, "; did you mean '{s}'?"),
            None => Ok(()),
        };
        match &self.kind {
            QueryErrorKind::UnexpectedChar(c) => {
                write!(f, "unexpected character '{c}' at column {col}")
            }
            QueryErrorKind::UnknownField { name, suggestion } => {
                write!(f, "unknown field '{name}' at column {col}")?;
                suggest(f, suggestion)
            }
            QueryErrorKind::ExpectedOperator { field } => write!(
                f,
                "expected an operator (= != < <= > >= in notin) after '{field}' at column {col}"
            ),
            QueryErrorKind::ExpectedValue { field } => {
                write!(f, "expected a value for '{field}' at column {col}")
            }
            QueryErrorKind::BadValue {
                field,
                value,
                expected,
            } => {
                write!(
                    f,
                    "invalid value '{value}' for '{field}' at column {col}: expected {expected}"
                )
            }
            QueryErrorKind::UnknownGpu { name, suggestion } => {
                write!(f, "unknown GPU '{name}' at column {col}")?;
                suggest(f, suggestion)
            }
            QueryErrorKind::OperatorNotAllowed { field, op } => write!(
                f,
                "'{field}' cannot be compared with '{}' (at column {col}); use = != in notin",
                op.as_str()
            ),
            QueryErrorKind::ExpectedList => write!(f, "expected a list like [a,b] at column {col}"),
            QueryErrorKind::UnterminatedList => {
                write!(f, "list opened at column {col} is not closed with ']'")
            }
            QueryErrorKind::EmptyList => write!(f, "empty list at column {col}"),
            QueryErrorKind::UnexpectedToken(t) => {
                write!(f, "expected a field name at column {col}, found '{t}'")
            }
            QueryErrorKind::ExpectedOrderKey => write!(
                f,
                "expected an order key (price, reliability, vram, count, cc, pcie_gen, tier, age, driver, cuda) at column {col}"
            ),
            QueryErrorKind::UnknownOrderKey { name, suggestion } => {
                write!(f, "unknown order key '{name}' at column {col}")?;
                suggest(f, suggestion)
            }
            QueryErrorKind::TooLong { len } => {
                write!(
                    f,
                    "query of {len} bytes is longer than the {MAX_QUERY_BYTES} allowed"
                )
            }
            QueryErrorKind::TooMany { what, max } => {
                write!(f, "more than {max} {what} (at column {col})")
            }
        }
    }
}

impl std::error::Error for QueryError {}

/// The candidate `word` is most likely a slip for: one it is a prefix of (`pcie` for
/// `pcie_gen`), else the closest by edit distance if that is close enough to be a typo (at
/// most 2 edits, and fewer than half the word's length).
pub(crate) fn closest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let word = word.to_ascii_lowercase();
    let candidates: Vec<&'a str> = candidates.into_iter().collect();
    if word.len() >= 3
        && let Some(c) = candidates.iter().find(|c| c.starts_with(&word))
    {
        return Some(c);
    }
    candidates
        .into_iter()
        .map(|c| (edit_distance(&word, c), c))
        .filter(|&(d, c)| d <= 2 && d * 2 < word.len().max(c.len()))
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// Optimal-string-alignment distance (Levenshtein plus adjacent transpositions), so that
/// `vrma` is one edit from `vram`.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests;

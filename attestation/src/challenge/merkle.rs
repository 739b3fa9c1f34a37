//! A binary Merkle tree over blake3 leaves: the host commits to its product's rows with one
//! root and later opens the rows the renter picks, each with its path.
//!
//! Leaves are padded to a power of two with zero hashes (never stored: see [`pads`]); a
//! parent is blake3 in derive-key
//! mode ([`NODE_CONTEXT`]) over its two children, so no leaf (a row's hash, in its own
//! context) can pass for a parent.

/// The derive-key context of a parent node.
pub const NODE_CONTEXT: &str = "gpux challenge 2026-12 merkle node";

/// A hash in the tree.
pub type Hash = [u8; 32];

/// A parent node: blake3 in [`NODE_CONTEXT`] over its two children.
pub fn parent(left: &Hash, right: &Hash) -> Hash {
    let mut h = blake3::Hasher::new_derive_key(NODE_CONTEXT);
    h.update(left);
    h.update(right);
    *h.finalize().as_bytes()
}

/// The hash of a subtree of padding at each level `0 ..= depth`: zeros for a leaf, then
/// the parent of two of the level below.
pub fn pads(depth: usize) -> Vec<Hash> {
    let mut pads = vec![[0u8; 32]];
    for l in 0..depth {
        pads.push(parent(&pads[l], &pads[l]));
    }
    pads
}

/// The level above `below`: the parent of each pair, the last node paired with `pad` when
/// `below` is odd (the CUDA prover's `merkle_level` kernel computes the same).
pub fn level_above(below: &[Hash], pad: &Hash) -> Vec<Hash> {
    below
        .chunks(2)
        .map(|p| parent(&p[0], p.get(1).unwrap_or(pad)))
        .collect()
}

/// The siblings on the way from leaf `index` to the root of a tree of `depth` levels above
/// its leaves, bottom first: `node(level, i)` is node `i` of a level when it holds one
/// (`None` past its end: padding).
pub fn path_with(
    depth: usize,
    index: usize,
    mut node: impl FnMut(usize, usize) -> Option<Hash>,
) -> Vec<Hash> {
    let pads = pads(depth);
    (0..depth)
        .map(|level| node(level, (index >> level) ^ 1).unwrap_or(pads[level]))
        .collect()
}

/// Every level of the tree, leaves first, root last. The leaves are padded to a power of
/// two, but no level stores its padding: level `l` holds its first `ceil(leaves / 2^l)`
/// nodes, the rest are [`pads`].
#[derive(Debug, Clone)]
pub struct Tree {
    levels: Vec<Vec<Hash>>,
}

impl Tree {
    /// The tree over `leaves` (none: a tree of one zero leaf).
    pub fn new(leaves: Vec<Hash>) -> Tree {
        let mut level = leaves;
        if level.is_empty() {
            level.push([0; 32]);
        }
        let pads = pads(depth(level.len()));
        let mut levels = vec![level];
        while let Some(below) = levels.last().filter(|l| l.len() > 1) {
            let above = level_above(below, &pads[levels.len() - 1]);
            levels.push(above);
        }
        Tree { levels }
    }

    /// A tree from its levels, as [`Tree::new`] would have computed them (the CUDA prover
    /// computes them on the GPU), if each level is the right length and the last is the
    /// root alone.
    pub fn from_levels(levels: Vec<Vec<Hash>>) -> Option<Tree> {
        let leaves = levels.first()?.len();
        let shaped = levels.len() == depth(leaves) + 1
            && levels
                .iter()
                .enumerate()
                .all(|(l, level)| level.len() == leaves.div_ceil(1 << l));
        shaped.then_some(Tree { levels })
    }

    /// The root.
    pub fn root(&self) -> Hash {
        self.levels
            .last()
            .and_then(|l| l.first())
            .copied()
            .unwrap_or([0; 32])
    }

    /// The siblings on the way from leaf `index` to the root, bottom first.
    pub fn path(&self, index: usize) -> Vec<Hash> {
        path_with(self.levels.len() - 1, index, |level, i| {
            self.levels[level].get(i).copied()
        })
    }
}

/// The number of siblings on a path in a tree of `leaves` leaves.
pub fn depth(leaves: usize) -> usize {
    leaves.max(1).next_power_of_two().trailing_zeros() as usize
}

/// Whether `leaf` is leaf `index` of a tree of `leaves` leaves with this `root`.
pub fn holds(root: &Hash, leaves: usize, index: usize, leaf: &Hash, path: &[Hash]) -> bool {
    if index >= leaves || path.len() != depth(leaves) {
        return false;
    }
    let mut at = *leaf;
    let mut i = index;
    for sibling in path {
        at = if i.is_multiple_of(2) {
            parent(&at, sibling)
        } else {
            parent(sibling, &at)
        };
        i /= 2;
    }
    at == *root
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tree that stores no padding has the root and paths of the padded one.
    #[test]
    fn the_tree_is_the_padded_tree() {
        for count in [1usize, 2, 3, 5, 6, 7, 9, 16, 17] {
            let leaves: Vec<Hash> = (0..count)
                .map(|i| *blake3::hash(&[i as u8]).as_bytes())
                .collect();
            let mut padded = vec![leaves.clone()];
            padded[0].resize(count.next_power_of_two(), [0; 32]);
            while let Some(below) = padded.last().filter(|l| l.len() > 1) {
                let above = below.chunks(2).map(|p| parent(&p[0], &p[1])).collect();
                padded.push(above);
            }
            let tree = Tree::new(leaves);
            assert_eq!(tree.root(), padded.last().unwrap()[0], "{count} leaves");
            for i in 0..count {
                let want: Vec<Hash> = padded[..padded.len() - 1]
                    .iter()
                    .enumerate()
                    .map(|(l, level)| level[(i >> l) ^ 1])
                    .collect();
                assert_eq!(tree.path(i), want, "{count} leaves, leaf {i}");
            }
            let levels = tree.levels.clone();
            assert!(Tree::from_levels(levels.clone()).is_some());
            let mut rootless = levels.clone();
            rootless.pop();
            assert!(Tree::from_levels(rootless).is_none(), "{count} leaves");
            if count > 1 {
                let mut short = levels;
                short[1].pop();
                assert!(Tree::from_levels(short).is_none(), "{count} leaves");
            }
        }
    }

    #[test]
    fn every_leaf_opens_and_nothing_else_does() {
        for count in [1usize, 2, 3, 5, 8, 13] {
            let leaves: Vec<Hash> = (0..count)
                .map(|i| *blake3::hash(&[i as u8]).as_bytes())
                .collect();
            let tree = Tree::new(leaves.clone());
            let root = tree.root();
            for (i, leaf) in leaves.iter().enumerate() {
                let path = tree.path(i);
                assert!(
                    holds(&root, count, i, leaf, &path),
                    "{count} leaves, leaf {i}"
                );
                // Another leaf, another index, a shortened path: refused.
                assert!(!holds(&root, count, i, &[9; 32], &path));
                if count > 1 {
                    assert!(!holds(&root, count, (i + 1) % count, leaf, &path));
                    assert!(!holds(&root, count, i, leaf, &path[1..]));
                }
            }
            assert!(!holds(&root, count, count, &leaves[0], &tree.path(0)));
        }
    }
}

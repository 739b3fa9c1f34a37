//! A binary Merkle tree over blake3 leaves: the host commits to its product's rows with one
//! root and later opens the rows the renter picks, each with its path.
//!
//! Leaves are padded to a power of two with zero hashes; a parent is blake3 in derive-key
//! mode ([`NODE_CONTEXT`]) over its two children, so no leaf (a row's hash, in its own
//! context) can pass for a parent.

/// The derive-key context of a parent node.
pub const NODE_CONTEXT: &str = "gpux challenge 2026-12 merkle node";

/// A hash in the tree.
pub type Hash = [u8; 32];

fn parent(left: &Hash, right: &Hash) -> Hash {
    let mut h = blake3::Hasher::new_derive_key(NODE_CONTEXT);
    h.update(left);
    h.update(right);
    *h.finalize().as_bytes()
}

/// Every level of the tree, leaves first, root last.
#[derive(Debug, Clone)]
pub struct Tree {
    levels: Vec<Vec<Hash>>,
}

impl Tree {
    /// The tree over `leaves` (at least one).
    pub fn new(leaves: Vec<Hash>) -> Tree {
        let width = leaves.len().max(1).next_power_of_two();
        let mut level = leaves;
        level.resize(width, [0; 32]);
        let mut levels = vec![level];
        while levels.last().is_some_and(|l| l.len() > 1) {
            let below = levels.last().map(Vec::as_slice).unwrap_or_default();
            let above = below
                .chunks_exact(2)
                .map(|p| parent(&p[0], &p[1]))
                .collect();
            levels.push(above);
        }
        Tree { levels }
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
        let mut i = index;
        let mut path = Vec::with_capacity(self.levels.len().saturating_sub(1));
        for level in &self.levels[..self.levels.len() - 1] {
            path.push(level[i ^ 1]);
            i /= 2;
        }
        path
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

//! The peer id gpux computes equals the one libp2p computes for the same ed25519 key.

use gpux_protocol::{Keypair, PeerId};

#[test]
fn peer_id_matches_libp2p_identity() {
    for seed in [
        [0u8; 32],
        [7; 32],
        [0xff; 32],
        *blake3::hash(b"gpux").as_bytes(),
    ] {
        let ours = Keypair::from_seed(&seed);
        let theirs = libp2p_identity::Keypair::ed25519_from_bytes(seed).unwrap();
        let their_id = theirs.public().to_peer_id();
        assert_eq!(ours.peer_id().to_bytes().to_vec(), their_id.to_bytes());
        assert_eq!(ours.peer_id().to_string(), their_id.to_base58());
        assert_eq!(
            their_id.to_base58().parse::<PeerId>().unwrap(),
            ours.peer_id()
        );
    }
}

//! Node identity: the ed25519 key pair, the public key as it travels on the wire, and the
//! libp2p `PeerId` derived from the same key. No I/O here: the key file lives in `gpux-node`.

use std::fmt;
use std::str::FromStr;

use ed25519_dalek::{Signer, SigningKey, VerifyingKey};

use crate::types::{ParseError, hex, serde_via_str, unhex};

/// An ed25519 public key as it appears on the wire: 32 bytes, not yet checked to be a valid,
/// strong curve point (verification does that).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, bincode::Encode, bincode::Decode)]
pub struct PublicKey(pub [u8; 32]);

impl PublicKey {
    /// The libp2p peer id of this key.
    pub fn peer_id(&self) -> PeerId {
        PeerId::from_public_key(self)
    }

    /// Parses the key as a curve point and refuses small-order ("weak") keys, as
    /// `verify_strict` would.
    pub fn to_verifying_key(&self) -> Result<VerifyingKey, KeyError> {
        // curve25519-dalek reduces a y >= p silently; other implementations refuse it, and so
        // do we, so that every key has exactly one encoding.
        if crate::envelope::is_non_canonical_y(&self.0) {
            return Err(KeyError::NonCanonical);
        }
        let key = VerifyingKey::from_bytes(&self.0).map_err(|_| KeyError::NotAPoint)?;
        if key.is_weak() {
            return Err(KeyError::Weak);
        }
        Ok(key)
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", hex(&self.0[..8]))
    }
}

impl FromStr for PublicKey {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let bytes = unhex(s).map_err(|e| ParseError::new("public key", s, e.reason))?;
        bytes
            .try_into()
            .map(Self)
            .map_err(|_| ParseError::new("public key", s, "expected 64 hex digits"))
    }
}
serde_via_str!(PublicKey);

/// A public key that cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The 32 bytes do not decode to a curve point.
    #[error("the public key is not a valid ed25519 point")]
    NotAPoint,
    /// The encoding is not canonical (its y coordinate is not reduced modulo p).
    #[error("the public key is not canonically encoded")]
    NonCanonical,
    /// The key is of small order: anyone could forge signatures for it.
    #[error("the public key is a weak (small-order) point")]
    Weak,
}

/// A node's ed25519 key pair. The secret is wiped from memory when the pair is dropped.
#[derive(Clone)]
pub struct Keypair {
    signing: SigningKey,
}

impl Keypair {
    /// The key pair for a 32-byte secret seed (RFC 8032's private key).
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        Self {
            signing: SigningKey::from_bytes(seed),
        }
    }

    /// The 32-byte secret seed, for writing the key file.
    pub fn seed(&self) -> [u8; 32] {
        self.signing.to_bytes()
    }

    /// The public key.
    pub fn public(&self) -> PublicKey {
        PublicKey(self.signing.verifying_key().to_bytes())
    }

    /// The libp2p peer id.
    pub fn peer_id(&self) -> PeerId {
        self.public().peer_id()
    }

    /// Signs raw bytes. Crate-private: everything signed goes through [`crate::Signed::sign`],
    /// which adds the domain-separation tag.
    pub(crate) fn sign_raw(&self, message: &[u8]) -> [u8; 64] {
        self.signing.sign(message).to_bytes()
    }
}

impl fmt::Debug for Keypair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the secret.
        write!(f, "Keypair({:?})", self.public())
    }
}

/// The protobuf encoding libp2p uses for an ed25519 public key: field 1 (key type) = 1
/// (Ed25519), field 2 (data) = the 32 key bytes.
const PROTOBUF_ED25519_PREFIX: [u8; 4] = [0x08, 0x01, 0x12, 0x20];
/// Multihash code 0x00 (identity), digest length 36: keys of 42 bytes or less are inlined.
const MULTIHASH_IDENTITY_PREFIX: [u8; 2] = [0x00, 36];

/// A libp2p peer id: the identity multihash of the protobuf-encoded public key, as libp2p
/// derives it for ed25519 keys. Displayed in base58btc (`12D3KooW...`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerId([u8; 38]);

impl PeerId {
    /// The peer id of an ed25519 public key.
    pub fn from_public_key(key: &PublicKey) -> Self {
        let mut bytes = [0u8; 38];
        bytes[..2].copy_from_slice(&MULTIHASH_IDENTITY_PREFIX);
        bytes[2..6].copy_from_slice(&PROTOBUF_ED25519_PREFIX);
        bytes[6..].copy_from_slice(&key.0);
        Self(bytes)
    }

    /// The multihash bytes, as `libp2p::PeerId::to_bytes` gives them.
    pub fn to_bytes(&self) -> [u8; 38] {
        self.0
    }

    /// The ed25519 public key inlined in the id.
    pub fn public_key(&self) -> PublicKey {
        let mut key = [0u8; 32];
        key.copy_from_slice(&self.0[6..]);
        PublicKey(key)
    }
}

impl fmt::Display for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&bs58::encode(&self.0).into_string())
    }
}

impl fmt::Debug for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PeerId({self})")
    }
}

impl FromStr for PeerId {
    type Err = ParseError;
    /// Parses the base58btc form of an ed25519 peer id; other key types are refused.
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let bytes = bs58::decode(s)
            .into_vec()
            .map_err(|_| ParseError::new("peer id", s, "it is not base58"))?;
        let bytes: [u8; 38] = bytes
            .try_into()
            .map_err(|_| ParseError::new("peer id", s, "it is not an ed25519 peer id"))?;
        if bytes[..2] != MULTIHASH_IDENTITY_PREFIX || bytes[2..6] != PROTOBUF_ED25519_PREFIX {
            return Err(ParseError::new(
                "peer id",
                s,
                "it is not an ed25519 peer id",
            ));
        }
        Ok(Self(bytes))
    }
}
serde_via_str!(PeerId);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_id_round_trips_through_text() {
        let pair = Keypair::from_seed(&[9; 32]);
        let id = pair.peer_id();
        let text = id.to_string();
        assert!(text.starts_with("12D3KooW"), "{text}");
        assert_eq!(text.parse::<PeerId>().unwrap(), id);
        assert_eq!(id.public_key(), pair.public());
        assert!("12D3KooWnotbase58!".parse::<PeerId>().is_err());
        assert!("Qm".parse::<PeerId>().is_err());
    }

    #[test]
    fn weak_keys_are_refused() {
        // The identity point (y = 1) has small order.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert_eq!(PublicKey(identity).to_verifying_key(), Err(KeyError::Weak));
        assert!(
            Keypair::from_seed(&[1; 32])
                .public()
                .to_verifying_key()
                .is_ok()
        );
    }

    #[test]
    fn debug_never_prints_the_secret() {
        let pair = Keypair::from_seed(&[0x5a; 32]);
        assert!(!format!("{pair:?}").contains(&hex(&[0x5a; 4])));
    }
}

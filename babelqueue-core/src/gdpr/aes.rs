//! The family's reference cipher: AES-256-GCM, a random 12-byte nonce before the sealed
//! bytes, standard padded base64 around both.

use std::fmt;

use aes_gcm::aead::{Aead, Generate, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::{Cipher, CipherError};

/// The length of an [`AesGcmCipher`] key: 32 bytes (AES-256).
pub const AES_GCM_KEY_LEN: usize = 32;

const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;

/// The family's reference [`Cipher`]: AES-256-GCM with a fresh random 12-byte nonce per
/// value, no associated data; the token is the standard, padded base64 of the nonce
/// followed by the ciphertext and its 16-byte tag.
///
/// It is the format of the Go SDK's `AESGCMCipher` and of the Python SDK's documented
/// `cryptography` cipher, so a field sealed by any of them opens in the others with the
/// same key. The key is the caller's (32 raw bytes): this type does no key management,
/// rotation or derivation. Its memory is wiped when the cipher is dropped, and its
/// `Debug` shows nothing of it.
///
/// Needs the `gdpr` feature.
///
/// ```
/// use babelqueue_core::gdpr::{AesGcmCipher, Cipher};
///
/// let cipher = AesGcmCipher::new(&[7u8; 32])?;
/// let token = cipher.encrypt(br#""alice@example.com""#)?;
/// assert_ne!(token, cipher.encrypt(br#""alice@example.com""#)?, "a new nonce each time");
/// assert_eq!(cipher.decrypt(&token)?, br#""alice@example.com""#);
///
/// // Another key cannot open it.
/// assert!(AesGcmCipher::new(&[8u8; 32])?.decrypt(&token).is_err());
/// // Nor is a key of another length accepted.
/// assert!(AesGcmCipher::new(&[7u8; 16]).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct AesGcmCipher {
    aead: Aes256Gcm,
}

impl AesGcmCipher {
    /// A cipher with `key`, which must be [`AES_GCM_KEY_LEN`] (32) raw bytes.
    pub fn new(key: &[u8]) -> Result<Self, InvalidKeyLength> {
        if key.len() != AES_GCM_KEY_LEN {
            return Err(InvalidKeyLength { len: key.len() });
        }
        let aead =
            Aes256Gcm::new_from_slice(key).map_err(|_| InvalidKeyLength { len: key.len() })?;
        Ok(AesGcmCipher { aead })
    }
}

impl fmt::Debug for AesGcmCipher {
    /// Shows no key material.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AesGcmCipher").finish_non_exhaustive()
    }
}

impl Cipher for AesGcmCipher {
    fn encrypt(&self, plaintext: &[u8]) -> Result<String, CipherError> {
        let nonce = Nonce::try_generate()
            .map_err(|e| CipherError::with_source("no random nonce from the system", e))?;
        let sealed = self
            .aead
            .encrypt(&nonce, plaintext)
            .map_err(|_| CipherError::new("AES-GCM refused to seal the value (too long)"))?;
        let mut raw = Vec::with_capacity(NONCE_LEN + sealed.len());
        raw.extend_from_slice(nonce.as_slice());
        raw.extend_from_slice(&sealed);
        Ok(STANDARD.encode(raw))
    }

    fn decrypt(&self, token: &str) -> Result<Vec<u8>, CipherError> {
        let raw = STANDARD
            .decode(token)
            .map_err(|e| CipherError::with_source("not standard padded base64", e))?;
        if raw.len() < NONCE_LEN + TAG_LEN {
            return Err(CipherError::new(format!(
                "{} bytes, shorter than a nonce and a tag ({})",
                raw.len(),
                NONCE_LEN + TAG_LEN
            )));
        }
        let (nonce, sealed) = raw.split_at(NONCE_LEN);
        let nonce =
            Nonce::try_from(nonce).map_err(|_| CipherError::new("the nonce is not 12 bytes"))?;
        self.aead.decrypt(&nonce, sealed).map_err(|_| {
            CipherError::new("AES-GCM authentication failed (another key, or altered bytes)")
        })
    }
}

/// The key given to [`AesGcmCipher::new`] is not 32 bytes long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidKeyLength {
    len: usize,
}

impl InvalidKeyLength {
    /// The length of the key that was given, in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the key that was given was empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl fmt::Display for InvalidKeyLength {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "an AES-256-GCM key is {AES_GCM_KEY_LEN} bytes, not {}",
            self.len
        )
    }
}

impl std::error::Error for InvalidKeyLength {}

//! TLS for NBD (STARTTLS) through OpenSSL, for both ends, with the two kinds of credentials
//! nbdkit, qemu and libnbd use:
//!
//! - X.509: a directory laid out as nbdkit and qemu expect it: `ca-cert.pem` (the authority
//!   peers are checked against), `server-cert.pem` and `server-key.pem` for a server,
//!   `client-cert.pem` and `client-key.pem` for a client that presents one;
//! - pre-shared keys: a file in the format GnuTLS's `psktool` writes, one `identity:hexkey`
//!   per line.
//!
//! What lives here is credentials and the TLS handshake; when to ask for or require TLS is
//! the handshake module's (server) and the remote device's (client).

use crate::client::{BoxStream, Stream};
use openssl::ssl::{
    Ssl, SslConnector, SslContext, SslContextBuilder, SslFiletype, SslMethod, SslVerifyMode, SslVersion,
};
use std::collections::HashMap;
use std::io::{Error, ErrorKind, Result};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use tokio::io::{AsyncWrite, BufWriter};
use tokio_openssl::SslStream;

/// Reads a psktool file: `identity:hexkey` lines (blank lines and `#` comments skipped).
pub fn read_psk_file(path: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("{}: {e}", path.display())))?;
    let bad = |n: usize, why: &str| Error::new(ErrorKind::InvalidData, format!("{}:{n}: {why}", path.display()));
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (id, hex) = line.split_once(':').ok_or_else(|| bad(n + 1, "expected identity:hexkey"))?;
        if id.is_empty() || hex.len() % 2 != 0 || hex.is_empty() {
            return Err(bad(n + 1, "expected identity:hexkey with an even number of hex digits"));
        }
        let key: Option<Vec<u8>> =
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok()).collect();
        keys.push((id.to_string(), key.ok_or_else(|| bad(n + 1, "the key is not hexadecimal"))?));
    }
    if keys.is_empty() {
        return Err(bad(0, "no keys"));
    }
    Ok(keys)
}

fn ssl_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::InvalidData, format!("{what}: {e}"))
}

/// What both ends set up alike: TLS 1.2 or later, and reading ahead: OpenSSL then takes
/// whatever the socket holds in one read rather than a record header and a record body
/// apart (two system calls per 28-byte request record otherwise).
fn protocols(b: &mut SslContextBuilder, psk: bool) -> Result<()> {
    b.set_min_proto_version(Some(SslVersion::TLS1_2)).map_err(|e| ssl_err("TLS setup", e))?;
    b.set_read_ahead(true);
    // AES-GCM first: with AES instructions it costs a fraction of ChaCha20-Poly1305, which
    // OpenSSL's default order picks for a PSK (its first choice, AES-256-GCM-SHA384, does
    // not go with a PSK's SHA-256).
    b.set_ciphersuites("TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256")
        .map_err(|e| ssl_err("TLS setup", e))?;
    let ciphers = if psk { "HIGH:!aNULL:!MD5:PSK" } else { "HIGH:!aNULL:!MD5" };
    b.set_cipher_list(ciphers).map_err(|e| ssl_err("TLS setup", e))
}

/// Copies `s` into `out` NUL-terminated; the length without the NUL, or an error if it does
/// not fit.
fn put(out: &mut [u8], s: &[u8]) -> std::result::Result<usize, openssl::error::ErrorStack> {
    if s.len() >= out.len() {
        return Err(openssl::error::ErrorStack::get());
    }
    out[..s.len()].copy_from_slice(s);
    out[s.len()] = 0;
    Ok(s.len())
}

/// A client's TLS settings (the `nbds://` spec's options).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// `tls-psk-file=`: a psktool file; the key of `username` (or the first) is used.
    pub psk_file: Option<PathBuf>,
    /// `tls-username=`: which identity of the PSK file to present.
    pub username: Option<String>,
    /// `tls-certificates=`: a directory with `ca-cert.pem` (and maybe `client-cert.pem`,
    /// `client-key.pem`); without it, the system's authorities.
    pub certificates: Option<PathBuf>,
    /// `tls-verify=`: check the server's certificate and name (X.509 only).
    pub verify: bool,
}

/// No options: the system's authorities, certificates checked.
impl Default for ClientTls {
    fn default() -> ClientTls {
        ClientTls { psk_file: None, username: None, certificates: None, verify: true }
    }
}

impl ClientTls {
    /// Runs the TLS handshake as a client over `stream` (after STARTTLS was acknowledged).
    pub async fn connect(&self, host: &str, stream: BoxStream) -> Result<TlsStream<BoxStream>> {
        let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(|e| ssl_err("TLS setup", e))?;
        protocols(&mut b, self.psk_file.is_some())?;
        if let Some(file) = &self.psk_file {
            let keys = read_psk_file(file)?;
            let (id, key) = match &self.username {
                Some(u) => keys.into_iter().find(|(id, _)| id == u).ok_or_else(|| {
                    Error::new(ErrorKind::InvalidInput, format!("{}: no key for identity {u:?}", file.display()))
                })?,
                None => keys.into_iter().next().expect("read_psk_file returns at least one key"),
            };
            b.set_psk_client_callback(move |_, _hint, id_out, key_out| {
                put(id_out, id.as_bytes())?;
                if key.len() > key_out.len() {
                    return Err(openssl::error::ErrorStack::get());
                }
                key_out[..key.len()].copy_from_slice(&key);
                Ok(key.len())
            });
            // The key is what proves the server: a server that does not pick it (in TLS 1.3
            // it may fall back to a certificate) is refused, as no certificate is trusted.
            b.set_cipher_list("PSK").map_err(|e| ssl_err("TLS setup", e))?;
            let no_authority = openssl::x509::store::X509StoreBuilder::new().map_err(|e| ssl_err("TLS setup", e))?;
            b.set_cert_store(no_authority.build());
            b.set_verify(SslVerifyMode::PEER);
        } else {
            if let Some(dir) = &self.certificates {
                let ca = dir.join("ca-cert.pem");
                b.set_ca_file(&ca).map_err(|e| ssl_err(&ca.display().to_string(), e))?;
                let (cert, key) = (dir.join("client-cert.pem"), dir.join("client-key.pem"));
                if cert.exists() {
                    b.set_certificate_chain_file(&cert).map_err(|e| ssl_err(&cert.display().to_string(), e))?;
                    b.set_private_key_file(&key, SslFiletype::PEM)
                        .map_err(|e| ssl_err(&key.display().to_string(), e))?;
                }
            }
            b.set_verify(if self.verify { SslVerifyMode::PEER } else { SslVerifyMode::NONE });
        }
        let connector = b.build();
        let x509_verify = self.verify && self.psk_file.is_none();
        let ssl = connector
            .configure()
            .map_err(|e| ssl_err("TLS setup", e))?
            .verify_hostname(x509_verify)
            .use_server_name_indication(self.psk_file.is_none())
            .into_ssl(host)
            .map_err(|e| ssl_err("TLS setup", e))?;
        handshake(ssl, stream, Side::Client { psk: self.psk_file.is_some() }).await
    }
}

/// A TLS stream whose vectored writes are sealed together, in as few records as they fill:
/// the server writes a reply's header and payload (and many replies) as one vectored write,
/// and a TLS stream would otherwise seal each slice as a record of its own (a 16-byte
/// header costing as much as 4 KiB of data).
///
/// The records OpenSSL writes go into a buffer below it and reach the socket together when
/// the write is done (one system call for a batch of replies, not one per 16 KiB record);
/// what the socket does not take at once goes with the next write or `flush`, so a writer
/// that stops writing must flush (the transmission loop does when its queue is empty).
pub struct TlsStream<S>(SslStream<BufWriter<S>>, Vec<u8>);

/// Sealed records gathered before they go to the socket.
const RECORDS_BUFFER_BYTES: usize = RECORD_GATHER_BYTES + (64 << 10);

/// Bytes gathered into one record at most.
const RECORD_GATHER_BYTES: usize = 256 << 10;

impl<S: Stream> tokio::io::AsyncRead for TlsStream<S> {
    /// Reads as many records as are at hand, not one: a record per request would otherwise
    /// be a wake-up of the connection per request.
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<Result<()>> {
        let start = buf.filled().len();
        loop {
            let before = buf.filled().len();
            match Pin::new(&mut self.0).poll_read(cx, buf) {
                Poll::Ready(Ok(())) if buf.filled().len() > before && buf.remaining() > 0 => continue,
                Poll::Ready(Ok(())) => return Poll::Ready(Ok(())),
                // Errors and end of stream after some data: the data first, the rest next time.
                Poll::Ready(Err(_)) | Poll::Pending if buf.filled().len() > start => return Poll::Ready(Ok(())),
                other => return other,
            }
        }
    }
}

impl<S> TlsStream<S> {
    /// The cipher suite agreed, for status and logs.
    pub fn cipher(&self) -> String {
        let ssl = self.0.ssl();
        match ssl.current_cipher() {
            Some(c) => format!("{} {}", ssl.version_str(), c.name()),
            None => "none".into(),
        }
    }
}

impl<S: Stream> TlsStream<S> {
    /// Seals `buf` into records, then hands the sealed records to the socket now; what it
    /// does not take stays buffered.
    fn seal(&mut self, cx: &mut std::task::Context<'_>, buf: &[u8]) -> Poll<Result<usize>> {
        let written = Pin::new(&mut self.0).poll_write(cx, buf);
        if let Poll::Ready(Ok(_)) = written {
            let _ = Pin::new(self.0.get_mut()).poll_flush(cx);
        }
        written
    }
}

impl<S: Stream> AsyncWrite for TlsStream<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &[u8]) -> std::task::Poll<Result<usize>> {
        self.get_mut().seal(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<Result<usize>> {
        let this = self.get_mut();
        let first = bufs.iter().find(|b| !b.is_empty()).map_or(0, |b| b.len());
        if first >= RECORD_GATHER_BYTES || bufs.iter().filter(|b| !b.is_empty()).count() < 2 {
            let slice = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| &b[..]);
            return this.seal(cx, slice);
        }
        this.1.clear();
        for b in bufs {
            let room = RECORD_GATHER_BYTES - this.1.len();
            this.1.extend_from_slice(&b[..b.len().min(room)]);
            if this.1.len() == RECORD_GATHER_BYTES {
                break;
            }
        }
        let gathered = std::mem::take(&mut this.1);
        let written = this.seal(cx, &gathered);
        this.1 = gathered;
        written
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Which end of a handshake this is; a client says whether it offers a pre-shared key.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Server,
    Client { psk: bool },
}

async fn handshake<S: Stream>(ssl: Ssl, stream: S, side: Side) -> Result<TlsStream<S>> {
    let stream = BufWriter::with_capacity(RECORDS_BUFFER_BYTES, stream);
    let mut s = SslStream::new(ssl, stream).map_err(|e| ssl_err("TLS setup", e))?;
    let done = match side {
        Side::Server => Pin::new(&mut s).accept().await,
        Side::Client { .. } => Pin::new(&mut s).connect().await,
    };
    done.map_err(|e| {
        let verify = s.ssl().verify_result();
        let extra = match (verify.as_raw(), side) {
            (0, _) => String::new(),
            // A PSK client trusts no certificate: the server did not take the key.
            (_, Side::Client { psk: true }) => format!(
                " ({}: the server answered with a certificate rather than the pre-shared key; \
                 it has no PSK file, or no key for this identity)",
                verify.error_string()
            ),
            _ => format!(" ({})", verify.error_string()),
        };
        Error::new(ErrorKind::PermissionDenied, format!("TLS handshake failed: {e}{extra}"))
    })?;
    Ok(TlsStream(s, Vec::new()))
}

/// Whether a server offers TLS, and whether it insists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMode {
    #[default]
    Off,
    /// STARTTLS is answered; clients may also go on without it.
    On,
    /// Only STARTTLS, ABORT and harmless options are answered before TLS.
    Require,
}

impl std::str::FromStr for TlsMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<TlsMode, String> {
        match s {
            "off" => Ok(TlsMode::Off),
            "on" => Ok(TlsMode::On),
            "require" => Ok(TlsMode::Require),
            _ => Err(format!("bad TLS mode {s:?} (off, on or require)")),
        }
    }
}

/// A server's TLS: its mode and the context every connection's handshake starts from.
#[derive(Clone)]
pub struct ServerTls {
    pub mode: TlsMode,
    ctx: Arc<SslContext>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ServerTls({:?})", self.mode)
    }
}

impl ServerTls {
    /// A server's TLS from an X.509 directory and/or a PSK file (at least one);
    /// `verify_peer` asks clients for a certificate signed by `ca-cert.pem`.
    pub fn new(mode: TlsMode, certificates: Option<&Path>, psk: Option<&Path>, verify_peer: bool) -> Result<ServerTls> {
        if certificates.is_none() && psk.is_none() {
            return Err(Error::new(ErrorKind::InvalidInput, "TLS needs --tls-certificates DIR or --tls-psk FILE"));
        }
        let mut b = SslContext::builder(SslMethod::tls_server()).map_err(|e| ssl_err("TLS setup", e))?;
        protocols(&mut b, psk.is_some())?;
        if let Some(dir) = certificates {
            let (cert, key) = (dir.join("server-cert.pem"), dir.join("server-key.pem"));
            b.set_certificate_chain_file(&cert).map_err(|e| ssl_err(&cert.display().to_string(), e))?;
            b.set_private_key_file(&key, SslFiletype::PEM).map_err(|e| ssl_err(&key.display().to_string(), e))?;
            b.check_private_key().map_err(|e| ssl_err(&key.display().to_string(), e))?;
            if verify_peer {
                let ca = dir.join("ca-cert.pem");
                b.set_ca_file(&ca).map_err(|e| ssl_err(&ca.display().to_string(), e))?;
                b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
            }
        } else if verify_peer {
            return Err(Error::new(ErrorKind::InvalidInput, "--tls-verify-peer needs --tls-certificates DIR"));
        }
        if let Some(file) = psk {
            if certificates.is_some() {
                // A client with only a key (GnuTLS's, in libnbd and qemu) also offers
                // certificate suites, and fails if one is picked: the server's order, with the
                // PSK suites first, decides.
                b.set_cipher_list("PSK:HIGH:!aNULL:!MD5").map_err(|e| ssl_err("TLS setup", e))?;
                b.set_options(openssl::ssl::SslOptions::CIPHER_SERVER_PREFERENCE);
            }
            let keys: HashMap<Vec<u8>, Vec<u8>> =
                read_psk_file(file)?.into_iter().map(|(id, k)| (id.into_bytes(), k)).collect();
            b.set_psk_server_callback(move |_, identity, key_out| {
                let key = identity.and_then(|id| keys.get(id)).ok_or_else(openssl::error::ErrorStack::get)?;
                if key.len() > key_out.len() {
                    return Err(openssl::error::ErrorStack::get());
                }
                key_out[..key.len()].copy_from_slice(key);
                Ok(key.len())
            });
        }
        Ok(ServerTls { mode, ctx: Arc::new(b.build()) })
    }

    /// Runs the server side of the TLS handshake over `stream`.
    pub async fn accept<S: Stream>(&self, stream: S) -> Result<TlsStream<S>> {
        let ssl = Ssl::new(&self.ctx).map_err(|e| ssl_err("TLS setup", e))?;
        handshake(ssl, stream, Side::Server).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psk_files_in_psktool_format() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("keys.psk");
        std::fs::write(&f, "alice:00ff10\n\n# a comment\nbob:ABCD\n").unwrap();
        let keys = read_psk_file(&f).unwrap();
        assert_eq!(keys, [("alice".to_string(), vec![0, 0xff, 0x10]), ("bob".to_string(), vec![0xab, 0xcd])]);
        for bad in ["alice", "alice:0", "alice:zz", ":00", ""] {
            std::fs::write(&f, bad).unwrap();
            assert!(read_psk_file(&f).is_err(), "{bad:?}");
        }
    }
}

//! The negotiation phase: from the greeting to the option that picks an export (GO or
//! EXPORT_NAME). Unknown or malformed options get error replies without losing framing;
//! only a stream that cannot be framed any more (bad magic, absurd length) is dropped.

use crate::client::BoxStream;
use crate::export::{block_sizes, Export, Negotiated, Shared};
use crate::proto::*;
use crate::tls::TlsMode;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

/// Option payloads longer than this are drained and refused with ERR_TOO_BIG.
const OPTION_MAX_BYTES: u32 = 64 << 10;
/// Option payloads longer than this are not even drained: the client is hostile or broken.
const OPTION_ABSURD_BYTES: u32 = 16 << 20;
/// Options one connection may send before it must pick an export.
const OPTIONS_MAX: usize = 1024;

#[derive(Debug)]
pub enum HandshakeEnd {
    /// Client aborted or disconnected politely.
    Closed,
    /// The stream is unusable; close it. The string says why (for the log).
    Drop(String),
}

impl From<std::io::Error> for HandshakeEnd {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            HandshakeEnd::Closed
        } else {
            HandshakeEnd::Drop(format!("io error: {e}"))
        }
    }
}

struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    fn u16(&mut self) -> Option<u16> {
        let (h, t) = self.data.split_first_chunk::<2>()?;
        self.data = t;
        Some(u16::from_be_bytes(*h))
    }
    fn u32(&mut self) -> Option<u32> {
        let (h, t) = self.data.split_first_chunk::<4>()?;
        self.data = t;
        Some(u32::from_be_bytes(*h))
    }
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.data.len() < n {
            return None;
        }
        let (h, t) = self.data.split_at(n);
        self.data = t;
        Some(h)
    }
    fn string(&mut self) -> Option<String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.bytes(n)?.to_vec()).ok()
    }
}

pub fn transmission_flags(export: &Export, structured: bool) -> u16 {
    let g = export.dev.geometry();
    let mut f = TFLAG_HAS_FLAGS
        | TFLAG_SEND_FLUSH
        | TFLAG_SEND_FUA
        | TFLAG_SEND_TRIM
        | TFLAG_SEND_WRITE_ZEROES
        | TFLAG_SEND_CACHE
        | TFLAG_SEND_FAST_ZERO
        // Every device flushes globally: a flush on one connection covers writes completed on
        // any connection, which is exactly what CAN_MULTI_CONN promises.
        | TFLAG_CAN_MULTI_CONN;
    if structured {
        f |= TFLAG_SEND_DF;
    }
    if export.read_only {
        // Nothing that changes data is offered (they would only get EPERM).
        f = (f | TFLAG_READ_ONLY) & !(TFLAG_SEND_TRIM | TFLAG_SEND_WRITE_ZEROES | TFLAG_SEND_FAST_ZERO);
    }
    if g.rotational {
        f |= TFLAG_ROTATIONAL;
    }
    f
}

/// The connection's stream while negotiating: buffered for reading, replaced by its TLS
/// stream after STARTTLS.
pub type Negotiating = BufReader<BoxStream>;

pub async fn negotiate(s: &mut Negotiating, shared: &Shared) -> Result<Negotiated, HandshakeEnd> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(&NBDMAGIC.to_be_bytes());
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&out).await?;
    s.flush().await?;

    let client_flags = s.read_u32().await?;
    if client_flags & !(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES) != 0 {
        return Err(HandshakeEnd::Drop(format!("unknown client flags {client_flags:#x}")));
    }
    let no_zeroes = client_flags & CLIENT_NO_ZEROES != 0;
    let mut structured = false;
    // Meta contexts chosen by SET_META_CONTEXT, and for which export name.
    let mut meta: Option<(String, bool)> = None;
    let tls_mode = shared.tls.as_ref().map_or(TlsMode::Off, |t| t.mode);
    let mut secure = false;

    for _ in 0..OPTIONS_MAX {
        let magic = s.read_u64().await?;
        if magic != IHAVEOPT {
            return Err(HandshakeEnd::Drop(format!("bad option magic {magic:#x}")));
        }
        let opt = s.read_u32().await?;
        let len = s.read_u32().await?;
        if len > OPTION_ABSURD_BYTES {
            return Err(HandshakeEnd::Drop(format!("option {opt} with absurd length {len}")));
        }
        if len > OPTION_MAX_BYTES {
            tokio::io::copy(&mut (&mut *s).take(len as u64), &mut tokio::io::sink()).await?;
            if opt == OPT_EXPORT_NAME {
                return Err(HandshakeEnd::Drop("EXPORT_NAME too long".into()));
            }
            reply_err(s, opt, REP_ERR_TOO_BIG, "option too long").await?;
            continue;
        }
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data).await?;
        out.clear();

        if tls_mode == TlsMode::Require && !secure && !matches!(opt, OPT_STARTTLS | OPT_ABORT) {
            if opt == OPT_EXPORT_NAME {
                return Err(HandshakeEnd::Drop("EXPORT_NAME before STARTTLS; TLS is required".into()));
            }
            reply_err(s, opt, REP_ERR_TLS_REQD, "TLS is required: send STARTTLS first").await?;
            continue;
        }
        match opt {
            OPT_EXPORT_NAME => {
                // No error reply is possible here: an unknown name can only hang up.
                let name = String::from_utf8_lossy(&data).into_owned();
                let Some((export, retired)) = shared.attach(&name) else {
                    return Err(HandshakeEnd::Drop(format!("EXPORT_NAME {}: no such export", shown(&name))));
                };
                if shared.shutting_down() {
                    return Err(HandshakeEnd::Drop("server is shutting down".into()));
                }
                let flags = transmission_flags(&export, structured);
                out.extend_from_slice(&export.dev.size().to_be_bytes());
                out.extend_from_slice(&flags.to_be_bytes());
                if !no_zeroes {
                    out.extend_from_slice(&[0u8; 124]);
                }
                s.write_all(&out).await?;
                s.flush().await?;
                let base_allocation = matches!(&meta, Some((n, true)) if *n == name);
                return Ok(Negotiated {
                    export,
                    retired,
                    structured,
                    base_allocation,
                    block_size_agreed: false,
                    tls: secure,
                });
            }
            OPT_ABORT => {
                option_reply(&mut out, opt, REP_ACK, &[]);
                let _ = s.write_all(&out).await;
                let _ = s.flush().await;
                return Err(HandshakeEnd::Closed);
            }
            OPT_LIST => {
                if len != 0 {
                    reply_err(s, opt, REP_ERR_INVALID, "LIST takes no data").await?;
                    continue;
                }
                for e in &shared.exports() {
                    let mut d = Vec::with_capacity(4 + e.name.len());
                    d.extend_from_slice(&(e.name.len() as u32).to_be_bytes());
                    d.extend_from_slice(e.name.as_bytes());
                    d.extend_from_slice(e.description.as_bytes());
                    option_reply(&mut out, opt, REP_SERVER, &d);
                }
                option_reply(&mut out, opt, REP_ACK, &[]);
            }
            OPT_STARTTLS => {
                let Some(tls) = shared.tls.as_ref().filter(|t| t.mode != TlsMode::Off) else {
                    reply_err(s, opt, REP_ERR_POLICY, "TLS is not offered; use a Unix socket or loopback").await?;
                    continue;
                };
                if secure || len != 0 {
                    reply_err(s, opt, REP_ERR_INVALID, "TLS is already on, or STARTTLS with data").await?;
                    continue;
                }
                option_reply(&mut out, opt, REP_ACK, &[]);
                s.write_all(&out).await?;
                s.flush().await?;
                if !s.buffer().is_empty() {
                    return Err(HandshakeEnd::Drop("data sent after STARTTLS before the TLS handshake".into()));
                }
                // Options negotiated in the clear do not carry over (proto.md).
                (structured, meta) = (false, None);
                let placeholder: BoxStream = Box::new(tokio::io::join(tokio::io::empty(), tokio::io::sink()));
                let plain = std::mem::replace(s, BufReader::new(placeholder)).into_inner();
                let tls = tls.accept(plain).await.map_err(|e| HandshakeEnd::Drop(e.to_string()))?;
                *s = BufReader::with_capacity(64 << 10, Box::new(tls));
                secure = true;
                continue;
            }
            OPT_INFO | OPT_GO => {
                let mut r = Reader { data: &data };
                let parsed = (|| {
                    let name = r.string()?;
                    let n = r.u16()?;
                    let reqs: Option<Vec<u16>> = (0..n).map(|_| r.u16()).collect();
                    if !r.data.is_empty() {
                        return None;
                    }
                    Some((name, reqs?))
                })();
                let Some((name, reqs)) = parsed else {
                    reply_err(s, opt, REP_ERR_INVALID, "malformed INFO/GO request").await?;
                    continue;
                };
                let Some((export, retired)) = shared.attach(&name) else {
                    reply_err(s, opt, REP_ERR_UNKNOWN, &format!("no export named {}", shown(&name))).await?;
                    continue;
                };
                if shared.shutting_down() {
                    reply_err(s, opt, REP_ERR_SHUTDOWN, "server is shutting down").await?;
                    continue;
                }
                let flags = transmission_flags(&export, structured);
                let mut d = Vec::with_capacity(12);
                d.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                d.extend_from_slice(&export.dev.size().to_be_bytes());
                d.extend_from_slice(&flags.to_be_bytes());
                option_reply(&mut out, opt, REP_INFO, &d);
                // Always advertised: qemu assumes byte alignment without it.
                let (min, pref, max) = block_sizes(&export, shared.limits.max_request_bytes);
                let mut d = Vec::with_capacity(14);
                d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
                for v in [min, pref, max] {
                    d.extend_from_slice(&v.to_be_bytes());
                }
                option_reply(&mut out, opt, REP_INFO, &d);
                if reqs.contains(&INFO_NAME) {
                    let mut d = INFO_NAME.to_be_bytes().to_vec();
                    d.extend_from_slice(export.name.as_bytes());
                    option_reply(&mut out, opt, REP_INFO, &d);
                }
                if reqs.contains(&INFO_DESCRIPTION) && !export.description.is_empty() {
                    let mut d = INFO_DESCRIPTION.to_be_bytes().to_vec();
                    d.extend_from_slice(export.description.as_bytes());
                    option_reply(&mut out, opt, REP_INFO, &d);
                }
                option_reply(&mut out, opt, REP_ACK, &[]);
                s.write_all(&out).await?;
                s.flush().await?;
                if opt == OPT_GO {
                    let base_allocation = matches!(&meta, Some((n, true)) if *n == name);
                    let block_size_agreed = reqs.contains(&INFO_BLOCK_SIZE);
                    return Ok(Negotiated {
                        export,
                        retired,
                        structured,
                        base_allocation,
                        block_size_agreed,
                        tls: secure,
                    });
                }
                continue;
            }
            OPT_STRUCTURED_REPLY => {
                if len != 0 {
                    reply_err(s, opt, REP_ERR_INVALID, "STRUCTURED_REPLY takes no data").await?;
                    continue;
                }
                structured = true;
                option_reply(&mut out, opt, REP_ACK, &[]);
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                if opt == OPT_SET_META_CONTEXT {
                    // It replaces what was set before, even when it fails.
                    meta = None;
                }
                if opt == OPT_SET_META_CONTEXT && !structured {
                    reply_err(s, opt, REP_ERR_INVALID, "negotiate structured replies first").await?;
                    continue;
                }
                let mut r = Reader { data: &data };
                let parsed = (|| {
                    let name = r.string()?;
                    let n = r.u32()?;
                    let queries: Option<Vec<String>> = (0..n).map(|_| r.string()).collect();
                    if !r.data.is_empty() {
                        return None;
                    }
                    Some((name, queries?))
                })();
                let Some((name, queries)) = parsed else {
                    reply_err(s, opt, REP_ERR_INVALID, "malformed meta context request").await?;
                    continue;
                };
                if shared.find(&name).is_none() {
                    reply_err(s, opt, REP_ERR_UNKNOWN, &format!("no export named {}", shown(&name))).await?;
                    continue;
                }
                let wanted = if opt == OPT_LIST_META_CONTEXT {
                    queries.is_empty() || queries.iter().any(|q| q == "base:" || q == BASE_ALLOCATION)
                } else {
                    queries.iter().any(|q| q == BASE_ALLOCATION)
                };
                if wanted {
                    let mut d = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
                    d.extend_from_slice(BASE_ALLOCATION.as_bytes());
                    option_reply(&mut out, opt, REP_META_CONTEXT, &d);
                }
                if opt == OPT_SET_META_CONTEXT {
                    meta = Some((name, wanted));
                }
                option_reply(&mut out, opt, REP_ACK, &[]);
            }
            _ => {
                reply_err(s, opt, REP_ERR_UNSUP, "option not supported").await?;
                continue;
            }
        }
        s.write_all(&out).await?;
        s.flush().await?;
    }
    Err(HandshakeEnd::Drop(format!("more than {OPTIONS_MAX} options without choosing an export")))
}

async fn reply_err<W: AsyncWrite + Unpin>(wr: &mut W, opt: u32, kind: u32, msg: &str) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(20 + msg.len());
    option_reply(&mut out, opt, kind, msg.as_bytes());
    wr.write_all(&out).await?;
    wr.flush().await
}

/// A name a client sent, quoted for a reply or the log: at most 64 characters of it (a name
/// may be 64 KiB long, and an error message at most 4096 bytes).
fn shown(name: &str) -> String {
    match name.char_indices().nth(64) {
        Some((end, _)) => format!("{:?}...", &name[..end]),
        None => format!("{name:?}"),
    }
}

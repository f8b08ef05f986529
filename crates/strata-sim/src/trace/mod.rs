//! Block traces: reading them (plain, gzip or zstd), telling their format apart, and parsing
//! them into [`Request`]s one line at a time.
//!
//! Parsers stream: a trace is never loaded as text, and a malformed record stops the read
//! with an error that names the file's line number. Formats differ in units (bytes, 512-byte
//! sectors, 100 ns ticks, microseconds); every parser converts to bytes and nanoseconds.

mod formats;

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

pub use formats::{parser_for, LineParser};

/// Requests from different devices, volumes or files of one trace are kept apart by putting
/// the namespace number above this bit of the byte offset.
pub const NAMESPACE_SHIFT: u32 = 48;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoKind {
    Read,
    Write,
}

/// One IO request of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Time of the request in nanoseconds, if the format records one.
    pub time_ns: Option<u64>,
    /// Byte offset, with the namespace (device, volume, file) above [`NAMESPACE_SHIFT`].
    pub offset: u64,
    pub len: u64,
    pub kind: IoKind,
}

/// Trace formats `--format` accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// MSR Cambridge CSV: Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime
    Msr,
    /// fio iolog version 2 or 3
    Fio,
    /// blkparse default text output
    Blkparse,
    /// libCacheSim block CSV (CloudPhysics): version,time,op,size,lbn
    Cloudphysics,
    /// ARC/SPC .lis: start_block nblocks ignore reqno (512-byte blocks)
    Lis,
    /// Alibaba block: device_id,opcode,offset,length,timestamp
    Alibaba,
    /// Tencent CBS: Timestamp,Offset,Size,IOType,VolumeID
    Tencent,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Msr => "msr",
            Format::Fio => "fio",
            Format::Blkparse => "blkparse",
            Format::Cloudphysics => "cloudphysics",
            Format::Lis => "lis",
            Format::Alibaba => "alibaba",
            Format::Tencent => "tencent",
        }
    }

    /// The trace's own page size, when it counts in fixed pages rather than bytes.
    pub fn native_block_size(self) -> Option<u64> {
        match self {
            Format::Lis => Some(512),
            _ => None,
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A record the parser could not accept, with its 1-based line number.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("line {line}: {message}")]
    Malformed { line: u64, message: String },
    /// Not a `source`: the message carries the error, and an error chain printed whole
    /// would say it twice.
    #[error("reading the trace: {0}")]
    Io(io::Error),
    #[error("cannot tell the trace format from its first lines; pass --format ({0})")]
    UnknownFormat(String),
    #[error(
        "the trace splits into more than {0} accesses of {1}-byte blocks, more than a replay holds in memory; \
         use a larger --block-size or a part of the trace"
    )]
    TooManyAccesses(u64, u64),
}

impl From<io::Error> for TraceError {
    fn from(e: io::Error) -> TraceError {
        TraceError::Io(e)
    }
}

/// Open `path`, decompressing gzip or zstd (recognised by their magic numbers, whatever the
/// file name).
pub fn open_reader(path: &Path) -> io::Result<Box<dyn BufRead + Send>> {
    let mut file = BufReader::with_capacity(1 << 20, File::open(path)?);
    let magic = file.fill_buf()?;
    let reader: Box<dyn Read + Send> = if magic.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::bufread::MultiGzDecoder::new(file))
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(zstd::stream::read::Decoder::with_buffer(file)?)
    } else {
        return Ok(Box::new(file));
    };
    Ok(Box::new(BufReader::with_capacity(1 << 20, reader)))
}

/// Streaming parser over the lines of a reader. Yields requests until the end of the trace or
/// the first error.
pub struct Requests<R> {
    reader: R,
    parser: Box<dyn LineParser + Send>,
    /// Lines read ahead to guess the format, replayed before the rest.
    pending: std::collections::VecDeque<String>,
    line: u64,
    buf: String,
    done: bool,
}

impl<R: BufRead> Requests<R> {
    /// Parse `reader` as `format`, or guess the format from its first lines.
    pub fn new(mut reader: R, format: Option<Format>) -> Result<(Self, Format), TraceError> {
        let mut pending = std::collections::VecDeque::new();
        let format = match format {
            Some(f) => f,
            None => {
                // 32 records, past any number of comments and blank lines (up to 64 Ki lines).
                let mut records = 0;
                while records < 32 && pending.len() < 1 << 16 {
                    let mut line = String::new();
                    if reader.read_line(&mut line)? == 0 {
                        break;
                    }
                    let text = clean(&line);
                    records += usize::from(!text.is_empty() && !text.starts_with('#'));
                    pending.push_back(line);
                }
                guess_format(pending.iter().map(String::as_str))?
            }
        };
        let requests =
            Requests { reader, parser: parser_for(format), pending, line: 0, buf: String::new(), done: false };
        Ok((requests, format))
    }
}

impl<R: BufRead> Iterator for Requests<R> {
    type Item = Result<Request, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            let line = match self.pending.pop_front() {
                Some(l) => l,
                None => {
                    self.buf.clear();
                    match self.reader.read_line(&mut self.buf) {
                        Ok(0) => {
                            self.done = true;
                            return None;
                        }
                        Ok(_) => std::mem::take(&mut self.buf),
                        Err(e) => {
                            self.done = true;
                            return Some(Err(TraceError::Io(e)));
                        }
                    }
                }
            };
            self.line += 1;
            let text = clean(&line);
            if text.is_empty() || text.starts_with('#') {
                continue;
            }
            match self.parser.parse(text).and_then(|r| r.map(within_its_namespace).transpose()) {
                Ok(Some(r)) => return Some(Ok(r)),
                Ok(None) => continue,
                Err(message) => {
                    self.done = true;
                    return Some(Err(TraceError::Malformed { line: self.line, message }));
                }
            }
        }
        None
    }
}

/// A line without its surrounding white space and a byte-order mark (CSV files saved on
/// Windows begin with one).
fn clean(line: &str) -> &str {
    line.trim().trim_start_matches('\u{feff}').trim_start()
}

/// A request that ends inside its device (namespace): a length that would run past 256 TiB,
/// into the next device, is a malformed record, not a request to split into blocks.
fn within_its_namespace(r: Request) -> Result<Request, String> {
    let start = r.offset & ((1 << NAMESPACE_SHIFT) - 1);
    match start.checked_add(r.len) {
        Some(end) if end <= 1 << NAMESPACE_SHIFT => Ok(r),
        _ => Err(format!("a request of {} bytes at offset {start} runs past 256 TiB", r.len)),
    }
}

/// Parse a whole trace held in memory (tests, small samples).
pub fn parse_str(text: &str, format: Option<Format>) -> Result<(Vec<Request>, Format), TraceError> {
    let (reqs, format) = Requests::new(io::Cursor::new(text.as_bytes()), format)?;
    Ok((reqs.collect::<Result<Vec<_>, _>>()?, format))
}

fn is_uint(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// Tell the format from the first lines of a trace.
pub fn guess_format<'a>(lines: impl Iterator<Item = &'a str>) -> Result<Format, TraceError> {
    let mut first = None;
    for raw in lines {
        let line = clean(raw);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        first.get_or_insert_with(|| line.to_string());
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("fio version 2 iolog") || lower.starts_with("fio version 3 iolog") {
            return Ok(Format::Fio);
        }
        if lower.starts_with("version,time,op,size,lbn") {
            return Ok(Format::Cloudphysics);
        }
        if lower.starts_with("timestamp,offset,size,iotype,volumeid") {
            return Ok(Format::Tencent);
        }
        if lower.starts_with("timestamp,hostname,disknumber") {
            return Ok(Format::Msr);
        }
        if lower.starts_with("device_id,opcode") {
            return Ok(Format::Alibaba);
        }
        let csv: Vec<&str> = line.split(',').map(str::trim).collect();
        if csv.len() == 7 && matches!(csv[3].to_ascii_lowercase().as_str(), "read" | "write") {
            return Ok(Format::Msr);
        }
        if csv.len() == 5 {
            if matches!(csv[1], "R" | "W" | "r" | "w") {
                return Ok(Format::Alibaba);
            }
            if csv.iter().all(|f| is_uint(f)) && matches!(csv[3], "0" | "1") {
                return Ok(Format::Tencent);
            }
            if is_uint(csv[0]) && u8::from_str_radix(csv[2], 16).is_ok() {
                return Ok(Format::Cloudphysics);
            }
        }
        let ws: Vec<&str> = line.split_whitespace().collect();
        if let Some((a, b)) = ws.first().and_then(|t| t.split_once(',')) {
            if is_uint(a) && is_uint(b) && ws.len() >= 7 {
                return Ok(Format::Blkparse);
            }
        }
        if ws.len() == 4 && ws.iter().all(|t| is_uint(t)) {
            return Ok(Format::Lis);
        }
    }
    Err(TraceError::UnknownFormat(match first {
        Some(l) => format!("first record: '{}'", l.chars().take(80).collect::<String>()),
        None => "the trace is empty".to_string(),
    }))
}

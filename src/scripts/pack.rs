//! Commands packed as RESP, an array of bulk strings per command, straight into one
//! buffer ([`Packer`]), with where each word went ([`Words`]), so that nothing has to read
//! the packed bytes back.
//!
//! ```text
//! Packer::new(3, ..).bytes(b"SET") .bytes(key) .bytes(value)  ->  "*3\r\n$3\r\nSET\r\n..."  words 0, 1, 2
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // Packing is internal; every round packs its command once for all nodes.
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.lock("invoice:42").await?;
//! let _ = redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::ops::Range;

/// The most words a command keeps the place of without allocating (every command a
/// round sends has at most 15: a fenced acquisition's `SET`, `ZADD` and `PEXPIRE` when it
/// renews its counter set).
const INLINE_WORDS: usize = 16;

/// Where each word of a packed command is: kept as the command is written, so nothing
/// has to read the packed bytes back.
#[derive(Clone)]
pub(super) enum Words {
    Inline([Range<u32>; INLINE_WORDS], u8),
    Heap(Vec<Range<usize>>),
}

impl Words {
    fn push(&mut self, word: Range<usize>) {
        match self {
            Self::Inline(places, n) => {
                let at = usize::from(*n);
                match (u32::try_from(word.start), u32::try_from(word.end)) {
                    (Ok(start), Ok(end)) if at < INLINE_WORDS => {
                        places[at] = start..end;
                        *n += 1;
                    }
                    _ => {
                        let mut all: Vec<Range<usize>> = places[..at]
                            .iter()
                            .map(|r| r.start as usize..r.end as usize)
                            .collect();
                        all.push(word);
                        *self = Self::Heap(all);
                    }
                }
            }
            Self::Heap(all) => all.push(word),
        }
    }

    /// Where word `i` is.
    pub(super) fn get(&self, i: usize) -> Option<Range<usize>> {
        match self {
            Self::Inline(places, n) => places[..usize::from(*n)]
                .get(i)
                .map(|r| r.start as usize..r.end as usize),
            Self::Heap(all) => all.get(i).cloned(),
        }
    }

    /// How many words there are.
    pub(super) fn len(&self) -> usize {
        match self {
            Self::Inline(_, n) => usize::from(*n),
            Self::Heap(all) => all.len(),
        }
    }
}

/// Writes a command as RESP, an array of bulk strings, straight into one buffer: what
/// `redis::Cmd::get_packed_command` gives, without building a `Cmd` first. It notes where
/// each word goes.
pub(super) struct Packer(Vec<u8>, Words);

impl Packer {
    /// A command of `count` arguments whose own bytes come to about `size`.
    pub(super) fn new(count: usize, size: usize) -> Self {
        let mut buf = Vec::with_capacity(
            size.saturating_add(count.saturating_mul(16))
                .saturating_add(16),
        );
        array_header(&mut buf, count);
        Self(buf, Words::Inline(Default::default(), 0))
    }

    /// Writes `arg` as the next word; its index among the words.
    pub(super) fn bytes(&mut self, arg: &[u8]) -> usize {
        let end = bulk(&mut self.0, arg);
        self.1.push(end - arg.len()..end);
        self.1.len() - 1
    }

    /// Writes `n` in decimal as the next word; its index among the words.
    pub(super) fn int(&mut self, n: u64) -> usize {
        self.bytes(digits(n, &mut [0; 20]))
    }

    /// Starts the next command of a pipeline, of `count` words.
    pub(super) fn next_command(&mut self, count: usize) {
        array_header(&mut self.0, count);
    }

    /// The commands written, and where their words are.
    pub(super) fn finish(self) -> (Vec<u8>, Words) {
        (self.0, self.1)
    }
}

/// Starts a command of `count` words at the end of `out`: its RESP array header.
pub(super) fn array_header(out: &mut Vec<u8>, count: usize) {
    out.push(b'*');
    out.extend_from_slice(digits(count as u64, &mut [0; 20]));
    out.extend_from_slice(b"\r\n");
}

/// Writes `arg` as a RESP bulk string at the end of `out`; where `arg` ends in `out`.
pub(super) fn bulk(out: &mut Vec<u8>, arg: &[u8]) -> usize {
    out.push(b'$');
    out.extend_from_slice(digits(arg.len() as u64, &mut [0; 20]));
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(arg);
    let end = out.len();
    out.extend_from_slice(b"\r\n");
    end
}

/// `n` in decimal digits, written to the end of `buf`.
pub(super) fn digits(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

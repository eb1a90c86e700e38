//! The bounded SSE decoder: never a panic, never an event over its bound, and the same events
//! (or the same error) however the byte stream is split.
#![no_main]

use graph_os::transport::sse_decode::{Decoder, Event};
use libfuzzer_sys::fuzz_target;

const LINE: usize = 64;
const EVENT: usize = 256;

fn run(chunks: &[&[u8]]) -> (Vec<Event>, Option<graph_os::transport::sse_decode::DecodeError>) {
    let mut d = Decoder::new(LINE, EVENT);
    let mut out = Vec::new();
    for c in chunks {
        if let Err(e) = d.feed(c, &mut out) {
            return (out, Some(e));
        }
    }
    (out, None)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let step = usize::from(data[0]).max(1);
    let body = &data[1..];
    let whole = run(&[body]);
    let pieces: Vec<&[u8]> = body.chunks(step).collect();
    let split = run(&pieces);
    assert_eq!(whole.1, split.1, "the error depends on how the stream was split");
    if whole.1.is_none() {
        assert_eq!(whole.0, split.0, "the events depend on how the stream was split");
    }
    for e in whole.0.iter().chain(split.0.iter()) {
        assert!(e.data.len() <= EVENT, "an event over its bound");
    }
});

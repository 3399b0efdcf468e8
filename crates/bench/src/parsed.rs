//! One watch event as the watch clients read it, whatever its encoding: JSON lines
//! (`bench::watchers`) or protobuf frames (`bench::pbwatch`).

/// One parsed watch event.
#[derive(Debug, PartialEq)]
pub enum Parsed {
    Event { rv: u64, seq: Option<u64>, sent_nanos: Option<u128> },
    Bookmark { rv: u64 },
    Error { code: u16 },
    Garbage,
}

//! Shared by the binary's tests: its stderr read line by line, with a deadline.

use std::time::Duration;

/// A child's stderr, line by line.
pub struct Stderr(std::sync::mpsc::Receiver<String>);

impl Stderr {
    pub fn of(child: &mut std::process::Child) -> Stderr {
        use std::io::{BufRead, BufReader};
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Stderr(rx)
    }

    /// Lines until one for which `done` holds (at most 20 s), that one included.
    pub fn until(&self, done: impl Fn(&str) -> bool) -> Vec<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match self.0.recv_timeout(left) {
                Ok(line) => {
                    let stop = done(&line);
                    seen.push(line);
                    if stop {
                        return seen;
                    }
                }
                Err(_) => break,
            }
        }
        panic!("no expected line in:\n{}", seen.join("\n"));
    }
}

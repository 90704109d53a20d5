//! The report `babelqueue doctor` prints: lines of findings and a count of problems. Its
//! own module, so the doctor and the Redis commands that fill it in do not import each
//! other.

use std::fmt::Write as _;

/// Findings, in order: `ok`, `note` (worth knowing) and `problem` (the layout is not
/// the shared one: other SDKs, or this one, will misbehave).
#[derive(Default)]
pub(crate) struct Report {
    lines: Vec<(&'static str, String)>,
    problems: usize,
}

impl Report {
    pub(crate) fn ok(&mut self, text: impl Into<String>) {
        self.lines.push(("ok     ", text.into()));
    }
    pub(crate) fn note(&mut self, text: impl Into<String>) {
        self.lines.push(("note   ", text.into()));
    }
    pub(crate) fn problem(&mut self, text: impl Into<String>) {
        self.problems += 1;
        self.lines.push(("PROBLEM", text.into()));
    }
    pub(crate) fn problems(&self) -> usize {
        self.problems
    }
    pub(crate) fn text(&self) -> String {
        let mut s = String::new();
        for (kind, line) in &self.lines {
            let _ = writeln!(s, "{kind} {line}");
        }
        let _ = writeln!(s, "{} problem(s)", self.problems);
        s
    }
}

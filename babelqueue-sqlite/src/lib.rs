//! BabelQueue sqlite backend.

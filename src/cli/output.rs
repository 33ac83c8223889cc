//! Human tables and JSON on stdout.

use std::io::Write;

use spate::client::Error;

/// Print rows under headers, each column as wide as its widest cell.
pub fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let line = |cells: &mut dyn Iterator<Item = &str>, out: &mut String| {
        let mut parts = Vec::new();
        for (i, c) in cells.enumerate() {
            let w = widths.get(i).copied().unwrap_or(0);
            parts.push(format!("{c:<w$}"));
        }
        out.push_str(parts.join("  ").trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied(), &mut out);
    for row in rows {
        line(&mut row.iter().map(|s| s.as_str()), &mut out);
    }
    print_raw(&out);
}

pub fn json(value: &serde_json::Value) {
    print_raw(&format!("{value}\n"));
}

/// Write to stdout; a closed pipe (`| head`) ends quietly instead of panicking.
pub fn print_raw(s: &str) {
    let mut stdout = std::io::stdout().lock();
    if stdout.write_all(s.as_bytes()).and_then(|_| stdout.flush()).is_err() {
        std::process::exit(0);
    }
}

pub fn ids(v: &[i32]) -> String {
    v.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

pub fn json_err(e: serde_json::Error) -> Error {
    Error::Protocol(format!("encoding JSON: {e}"))
}

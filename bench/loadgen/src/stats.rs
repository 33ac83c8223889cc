//! Counters, latency histograms, the JSON report and the SVG percentile plot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latencies are recorded in microseconds, up to this bound (larger values clamp).
pub const latency_us_max: u64 = 120_000_000;

pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, latency_us_max, 3).expect("histogram bounds")
}

pub fn record(h: &mut Histogram<u64>, value_us: u64) {
    h.saturating_record(value_us.clamp(1, latency_us_max));
}

/// Wall-clock microseconds since the Unix epoch (shared clock of producer and consumer).
pub fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as u64
}

/// A histogram for the whole measurement plus one reset every progress tick.
pub struct SharedHist {
    inner: Mutex<(Histogram<u64>, Histogram<u64>)>,
}

impl SharedHist {
    pub fn new() -> SharedHist {
        SharedHist { inner: Mutex::new((new_histogram(), new_histogram())) }
    }

    /// Merge a thread-local batch of samples (one lock per response, not per record).
    pub fn merge(&self, local: &Histogram<u64>, measuring: bool) {
        let mut g = self.inner.lock().unwrap();
        if measuring {
            g.0.add(local).unwrap();
        }
        g.1.add(local).unwrap();
    }

    pub fn take_interval(&self) -> Histogram<u64> {
        let mut g = self.inner.lock().unwrap();
        std::mem::replace(&mut g.1, new_histogram())
    }

    pub fn total(&self) -> Histogram<u64> {
        self.inner.lock().unwrap().0.clone()
    }
}

#[derive(Default)]
pub struct Counters {
    pub sent_msgs: AtomicU64,
    pub sent_bytes: AtomicU64,
    pub acked_msgs: AtomicU64,
    pub acked_bytes: AtomicU64,
    pub consumed_msgs: AtomicU64,
    pub consumed_bytes: AtomicU64,
    pub produce_errors: AtomicU64,
    pub fetch_errors: AtomicU64,
    pub requests: AtomicU64,
}

impl Counters {
    pub fn add(c: &AtomicU64, v: u64) {
        c.fetch_add(v, Ordering::Relaxed);
    }
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

#[derive(Serialize, Clone, Debug, Default)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub p9999_ms: f64,
    pub max_ms: f64,
}

pub fn summarize(h: &Histogram<u64>) -> LatencySummary {
    if h.is_empty() {
        return LatencySummary::default();
    }
    let ms = |us: u64| us as f64 / 1000.0;
    LatencySummary {
        count: h.len(),
        mean_ms: h.mean() / 1000.0,
        p50_ms: ms(h.value_at_quantile(0.50)),
        p99_ms: ms(h.value_at_quantile(0.99)),
        p999_ms: ms(h.value_at_quantile(0.999)),
        p9999_ms: ms(h.value_at_quantile(0.9999)),
        max_ms: ms(h.max()),
    }
}

#[derive(Serialize, Clone, Debug, Default)]
pub struct Throughput {
    pub msgs: u64,
    pub bytes: u64,
    pub msgs_per_sec: f64,
    pub mb_per_sec: f64,
}

pub fn throughput(msgs: u64, bytes: u64, secs: f64) -> Throughput {
    Throughput { msgs, bytes, msgs_per_sec: msgs as f64 / secs, mb_per_sec: bytes as f64 / secs / 1e6 }
}

/// Percentile distribution plot in the style of HdrHistogram's plotter: x is
/// the percentile on a log scale of 1/(1-q), y is latency in ms (log scale).
pub fn percentile_svg(title: &str, series: &[(&str, &str, &Histogram<u64>)]) -> String {
    let (w, h) = (900.0, 500.0);
    let (left, right, top, bottom) = (70.0, 20.0, 40.0, 60.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let x_decades = 5.0; // up to 99.999%
    let qs: Vec<f64> = (0..=500).map(|i| 1.0 - 10f64.powf(-(i as f64) / 100.0)).collect();
    let mut y_min = f64::MAX;
    let mut y_max = f64::MIN;
    for (_, _, hist) in series {
        if hist.is_empty() {
            continue;
        }
        y_min = y_min.min((hist.min().max(1)) as f64 / 1000.0);
        y_max = y_max.max(hist.max() as f64 / 1000.0);
    }
    if y_min > y_max {
        y_min = 0.01;
        y_max = 1.0;
    }
    let y_lo = y_min.log10().floor();
    let y_hi = y_max.log10().ceil().max(y_lo + 1.0);
    let x_of = |q: f64| left + pw * ((1.0 / (1.0 - q).max(1e-5)).log10() / x_decades).min(1.0);
    let y_of = |ms: f64| top + ph * (1.0 - (ms.max(1e-3).log10() - y_lo) / (y_hi - y_lo));
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        w / 2.0,
        xml_escape(title)
    );
    for d in 0..=5 {
        let q = 1.0 - 10f64.powi(-d);
        let x = x_of(q);
        let label = ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%"][d as usize];
        s += &format!(
            "<line x1=\"{x}\" y1=\"{top}\" x2=\"{x}\" y2=\"{}\" stroke=\"#ddd\"/>\
             <text x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{label}</text>\n",
            top + ph,
            top + ph + 18.0
        );
    }
    let mut e = y_lo;
    while e <= y_hi {
        let v = 10f64.powf(e);
        let y = y_of(v);
        s += &format!(
            "<line x1=\"{left}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#ddd\"/>\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
            left + pw,
            left - 6.0,
            y + 4.0,
            fmt_ms(v)
        );
        e += 1.0;
    }
    s += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">percentile</text>\n\
         <text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">latency (ms)</text>\n",
        left + pw / 2.0,
        h - 15.0,
        top + ph / 2.0,
        top + ph / 2.0
    );
    for (i, (name, color, hist)) in series.iter().enumerate() {
        if hist.is_empty() {
            continue;
        }
        let pts: Vec<String> = qs
            .iter()
            .map(|&q| format!("{:.1},{:.1}", x_of(q), y_of(hist.value_at_quantile(q) as f64 / 1000.0)))
            .collect();
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n\
             <text x=\"{}\" y=\"{}\" fill=\"{color}\">{}</text>\n",
            pts.join(" "),
            left + 10.0,
            top + 16.0 + 16.0 * i as f64,
            xml_escape(name)
        );
    }
    s += "</svg>\n";
    s
}

fn fmt_ms(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

//! PNG line charts for strata's reports: miss-ratio curves from the simulator, and later the
//! benchmark suite's figures.
//!
//! Built on `plotters` with its pure-Rust `ab_glyph` text path, so it needs no fontconfig or
//! FreeType: only a TrueType file. It uses DejaVu Sans (Debian's `fonts-dejavu-core`), or the
//! file named by `STRATA_PLOT_FONT`, and fails with a clear error when neither exists.
//!
//! ```no_run
//! use strata_plot::{line_chart, ChartSpec, Series};
//! let spec = ChartSpec {
//!     title: "Hit ratio vs cache size".into(),
//!     x_label: "cache size (MiB)".into(),
//!     y_label: "hit ratio (%)".into(),
//!     series: vec![Series::new("lru", vec![(16.0, 20.0), (64.0, 41.5), (256.0, 63.0)])],
//!     log_x: true,
//!     ..ChartSpec::default()
//! };
//! line_chart("mrc.png".as_ref(), &spec).unwrap();
//! ```

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

/// Where Debian's fonts-dejavu-core puts the font.
pub const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
/// Environment variable that overrides [`DEFAULT_FONT`].
pub const FONT_ENV: &str = "STRATA_PLOT_FONT";

const FONT_FAMILY: &str = "sans-serif";

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("font file {path} not found ({source}); install it with `apt-get install -y fonts-dejavu-core` or set {FONT_ENV}")]
    FontMissing { path: PathBuf, source: std::io::Error },
    #[error("{0} is not a usable TrueType font")]
    BadFont(PathBuf),
    #[error("nothing to plot: every series is empty")]
    Empty,
    #[error("drawing {path}: {message}")]
    Draw { path: PathBuf, message: String },
}

/// One named line.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

impl Series {
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series { name: name.into(), points }
    }
}

/// What to draw. Axis labels should carry units, e.g. "cache size (MiB)".
#[derive(Debug, Clone, PartialEq)]
pub struct ChartSpec {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// Logarithmic x axis (all x must be > 0).
    pub log_x: bool,
    /// Logarithmic y axis (all y must be > 0).
    pub log_y: bool,
    /// Fixed axis ranges; derived from the data when `None`.
    pub x_range: Option<(f64, f64)>,
    pub y_range: Option<(f64, f64)>,
    /// Draw each series' points as faint dots and, over them, a moving average over this many
    /// points; `None` draws plain lines with markers.
    pub smooth: Option<usize>,
    pub width: u32,
    pub height: u32,
}

impl Default for ChartSpec {
    fn default() -> Self {
        ChartSpec {
            title: String::new(),
            x_label: String::new(),
            y_label: String::new(),
            series: Vec::new(),
            log_x: false,
            log_y: false,
            x_range: None,
            y_range: None,
            smooth: None,
            width: 1000,
            height: 650,
        }
    }
}

/// Register the font once per process.
fn ensure_font() -> Result<(), PlotError> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    let path = std::env::var_os(FONT_ENV).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(DEFAULT_FONT));
    let r = FONT.get_or_init(|| {
        let bytes = std::fs::read(&path).map_err(|e| format!("missing:{e}"))?;
        // plotters keeps fonts for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font(FONT_FAMILY, FontStyle::Normal, bytes).map_err(|_| "bad".to_string())
    });
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.starts_with("missing:") => Err(PlotError::FontMissing {
            path,
            source: std::io::Error::new(std::io::ErrorKind::NotFound, e.trim_start_matches("missing:").to_string()),
        }),
        Err(_) => Err(PlotError::BadFont(path)),
    }
}

/// A colour-blind-friendly palette (Okabe–Ito plus greys), cycled: the series of the second
/// round are drawn dashed with hollow markers, so up to twenty lines stay apart.
const PALETTE: [RGBColor; 10] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(240, 228, 66),
    RGBColor(120, 120, 120),
    RGBColor(150, 75, 0),
];

fn bounds(values: impl Iterator<Item = f64>, log: bool) -> Option<(f64, f64)> {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo > hi {
        return None;
    }
    if log {
        if lo == hi {
            return Some((lo / 2.0, hi * 2.0));
        }
        Some((lo / 1.15, hi * 1.15))
    } else {
        let pad = if hi > lo { (hi - lo) * 0.05 } else { lo.abs().max(1.0) * 0.1 };
        Some((lo - pad, hi + pad))
    }
}

fn moving_average(points: &[(f64, f64)], window: usize) -> Vec<(f64, f64)> {
    let w = window.max(1);
    (0..points.len())
        .map(|i| {
            let lo = i.saturating_sub(w / 2);
            let hi = (i + w / 2 + 1).min(points.len());
            let mean = points[lo..hi].iter().map(|p| p.1).sum::<f64>() / (hi - lo) as f64;
            (points[i].0, mean)
        })
        .collect()
}

/// Draw `spec` as a PNG at `path`.
pub fn line_chart(path: &Path, spec: &ChartSpec) -> Result<(), PlotError> {
    ensure_font()?;
    let all = || spec.series.iter().flat_map(|s| s.points.iter());
    let x = spec.x_range.or_else(|| bounds(all().map(|p| p.0), spec.log_x)).ok_or(PlotError::Empty)?;
    let y = spec.y_range.or_else(|| bounds(all().map(|p| p.1), spec.log_y)).ok_or(PlotError::Empty)?;
    let err = |e: &dyn std::fmt::Display| PlotError::Draw { path: path.to_path_buf(), message: e.to_string() };
    let root = BitMapBackend::new(path, (spec.width, spec.height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    match (spec.log_x, spec.log_y) {
        (false, false) => draw(&root, spec, x.0..x.1, y.0..y.1),
        (true, false) => draw(&root, spec, (x.0..x.1).log_scale(), y.0..y.1),
        (false, true) => draw(&root, spec, x.0..x.1, (y.0..y.1).log_scale()),
        (true, true) => draw(&root, spec, (x.0..x.1).log_scale(), (y.0..y.1).log_scale()),
    }
    .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

fn draw<X, Y>(root: &DrawingArea<BitMapBackend<'_>, Shift>, spec: &ChartSpec, x: X, y: Y) -> Result<(), String>
where
    X: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
    Y: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
    X::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
    Y::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(root)
        .caption(&spec.title, (FONT_FAMILY, 26))
        .margin(16)
        .x_label_area_size(52)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)
        .map_err(|e| e.to_string())?;
    let (log_x, log_y) = (spec.log_x, spec.log_y);
    let x_tick = move |v: &f64| tick_label(*v, log_x);
    let y_tick = move |v: &f64| tick_label(*v, log_y);
    chart
        .configure_mesh()
        .x_label_formatter(&x_tick)
        .y_label_formatter(&y_tick)
        .x_desc(&spec.x_label)
        .y_desc(&spec.y_label)
        .label_style((FONT_FAMILY, 15))
        .axis_desc_style((FONT_FAMILY, 18))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(210, 210, 210))
        .draw()
        .map_err(|e| e.to_string())?;
    for (k, s) in spec.series.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()];
        let dashed = (k / PALETTE.len()) % 2 == 1;
        let mut pts: Vec<(f64, f64)> = s.points.clone();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let line = match spec.smooth {
            Some(w) => {
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 2, color.mix(0.25).filled())))
                    .map_err(|e| e.to_string())?;
                moving_average(&pts, w)
            }
            None => pts.clone(),
        };
        let style = color.stroke_width(2);
        let drawn = if dashed {
            chart.draw_series(DashedLineSeries::new(line, 9, 5, style)).map_err(|e| e.to_string())?
        } else {
            chart.draw_series(LineSeries::new(line, style)).map_err(|e| e.to_string())?
        };
        drawn.label(s.name.clone()).legend(move |(x, y)| {
            let (dash, gap) = if dashed { (6, 4) } else { (22, 22) };
            plotters::element::DashedPathElement::new(vec![(x, y), (x + 22, y)], dash, gap, color.stroke_width(3))
        });
        if spec.smooth.is_none() {
            let marker = if dashed { color.stroke_width(2) } else { color.filled() };
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, marker))).map_err(|e| e.to_string())?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .label_font((FONT_FAMILY, 16))
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// A tick's label: the number without a needless ".0"; on a log axis only at 1, 2 and 5 of
/// each power of ten (the others crowd each other out).
fn tick_label(v: f64, log: bool) -> String {
    if log && v > 0.0 {
        let mantissa = v / 10f64.powf(v.log10().floor());
        if ![1.0, 2.0, 5.0, 10.0].iter().any(|m| (mantissa - m).abs() < 1e-6 * m) {
            return String::new();
        }
    }
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_png() {
        if !Path::new(DEFAULT_FONT).exists() && std::env::var_os(FONT_ENV).is_none() {
            eprintln!("skipping: no font at {DEFAULT_FONT}");
            return;
        }
        let dir = std::env::temp_dir().join(format!("strata-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.png");
        let spec = ChartSpec {
            title: "test".into(),
            x_label: "x (units)".into(),
            y_label: "y (%)".into(),
            series: vec![
                Series::new("a", vec![(1.0, 2.0), (10.0, 5.0)]),
                Series::new("b", vec![(1.0, 1.0), (10.0, 3.0)]),
            ],
            log_x: true,
            ..ChartSpec::default()
        };
        line_chart(&path, &spec).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn ticks_are_short_and_log_axes_keep_one_two_five() {
        assert_eq!(tick_label(20.0, false), "20");
        assert_eq!(tick_label(0.25, false), "0.25");
        assert_eq!(tick_label(70.0, false), "70");
        let log: Vec<String> =
            [1.0, 2.0, 3.0, 5.0, 7.0, 10.0, 20.0, 70.0, 200.0, 0.5].iter().map(|&v| tick_label(v, true)).collect();
        assert_eq!(log, ["1", "2", "", "5", "", "10", "20", "", "200", "0.5"]);
    }

    #[test]
    fn empty_is_an_error() {
        if !Path::new(DEFAULT_FONT).exists() {
            return;
        }
        let spec = ChartSpec::default();
        assert!(matches!(line_chart(Path::new("/nonexistent/x.png"), &spec), Err(PlotError::Empty)));
    }
}

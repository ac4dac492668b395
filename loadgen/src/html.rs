//! `--html FILE`: a self-contained report page — the run's parameters and results, a latency
//! percentile plot and throughput over time, drawn as inline SVG (no script, no stylesheet
//! or font fetched: it opens offline).

use std::fmt::Write as _;

use crate::report::LoadReport;

/// Plot size in SVG user units.
const PLOT_WIDTH: f64 = 720.0;
/// Plot height.
const PLOT_HEIGHT: f64 = 300.0;
/// Room for the axes' labels.
const MARGIN: f64 = 56.0;
/// Nines shown on the percentile axis (99.999 %).
const NINES_MAX: f64 = 5.0;

/// Escapes text for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The smallest "nice" number (1, 2 or 5 × a power of ten) at least `value` (for axis tops).
fn nice_ceiling(value: f64) -> f64 {
    if value <= 0.0 || !value.is_finite() {
        return 1.0;
    }
    let power = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|step| step * power).find(|&nice| nice >= value).unwrap_or(10.0 * power)
}

/// A line chart: `points` are `(x, y)` in data units, x in `[0, x_max]`, y from 0; ticks
/// label the axes. `bands` shade spans of x (e.g. the time a fault lasted) with a label;
/// `marks` draw a red line at an x (e.g. an anomaly) with a label.
pub struct Chart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub x_max: f64,
    pub x_ticks: Vec<(f64, String)>,
    pub points: Vec<(f64, f64)>,
    pub bands: Vec<(f64, f64, String)>,
    pub marks: Vec<(f64, String)>,
}

/// `count` ticks at most, at nice steps from 0 to `x_max`.
pub fn nice_ticks(x_max: f64, count: f64) -> Vec<(f64, String)> {
    let step = nice_ceiling(x_max / count).max(1.0);
    (0..).map(|tick| f64::from(tick) * step).take_while(|&at| at <= x_max).map(|at| (at, trim_number(at))).collect()
}

impl Chart<'_> {
    /// The chart as an inline SVG figure.
    pub fn svg(&self) -> String {
        let y_max = nice_ceiling(self.points.iter().map(|&(_, y)| y).fold(0.0, f64::max));
        let x_max = if self.x_max > 0.0 { self.x_max } else { 1.0 };
        let x = |value: f64| MARGIN + value / x_max * PLOT_WIDTH;
        let y = |value: f64| MARGIN / 2.0 + PLOT_HEIGHT - value / y_max * PLOT_HEIGHT;
        let (width, height) = (PLOT_WIDTH + MARGIN * 1.5, PLOT_HEIGHT + MARGIN * 1.6);
        let mut svg = String::new();
        let _ = write!(
            svg,
            r#"<figure><figcaption>{title}</figcaption><svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{title}">"#,
            title = escape(self.title)
        );
        let (left, bottom, right, top) = (x(0.0), y(0.0), x(x_max), y(y_max));
        let _ = write!(svg, r##"<rect x="{left}" y="{top}" width="{}" height="{}" fill="#fafafa" stroke="#999"/>"##, right - left, bottom - top);
        for (from, to, label) in &self.bands {
            let (from, to) = (x(from.clamp(0.0, x_max)), x(to.clamp(0.0, x_max)));
            let _ = write!(
                svg,
                r##"<rect x="{from}" y="{top}" width="{}" height="{}" fill="#f6c343" fill-opacity="0.3"><title>{}</title></rect>"##,
                (to - from).max(1.0),
                bottom - top,
                escape(label)
            );
        }
        for (at, label) in &self.marks {
            let at = x(at.clamp(0.0, x_max));
            let _ = write!(
                svg,
                r##"<line x1="{at}" x2="{at}" y1="{top}" y2="{bottom}" stroke="#d1242f" stroke-width="2"><title>{}</title></line>"##,
                escape(label)
            );
        }
        for step in 0..=4 {
            let value = y_max * f64::from(step) / 4.0;
            let _ = write!(
                svg,
                r##"<line x1="{left}" x2="{right}" y1="{at}" y2="{at}" stroke="#ddd"/><text x="{label_x}" y="{at}" text-anchor="end" dominant-baseline="middle" font-size="12">{value}</text>"##,
                at = y(value),
                label_x = left - 6.0,
                value = trim_number(value)
            );
        }
        for (value, label) in &self.x_ticks {
            let _ = write!(
                svg,
                r##"<line x1="{at}" x2="{at}" y1="{top}" y2="{bottom}" stroke="#ddd"/><text x="{at}" y="{label_y}" text-anchor="middle" font-size="12">{label}</text>"##,
                at = x(*value),
                label_y = bottom + 16.0,
                label = escape(label)
            );
        }
        let path: Vec<String> = self.points.iter().map(|&(px, py)| format!("{:.1},{:.1}", x(px.min(x_max)), y(py))).collect();
        let _ = write!(svg, r##"<polyline fill="none" stroke="#1f6feb" stroke-width="2" points="{}"/>"##, path.join(" "));
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle" font-size="13">{}</text><text x="14" y="{}" text-anchor="middle" font-size="13" transform="rotate(-90 14 {})">{}</text></svg></figure>"#,
            left + PLOT_WIDTH / 2.0,
            bottom + 36.0,
            escape(self.x_label),
            top + PLOT_HEIGHT / 2.0,
            top + PLOT_HEIGHT / 2.0,
            escape(self.y_label)
        );
        svg
    }
}

/// A number without trailing zeros (axis labels).
fn trim_number(value: f64) -> String {
    let text = format!("{value:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Where quantile `q` sits on the percentile axis: its number of nines, `-log10(1 - q)`.
fn nines(q: f64) -> f64 {
    (-(1.0 - q).max(10f64.powf(-NINES_MAX)).log10()).clamp(0.0, NINES_MAX)
}

/// The latency-by-percentile chart.
fn latency_chart(report: &LoadReport) -> Chart<'static> {
    let x_ticks = [(0.0, "0%"), (1.0, "90%"), (2.0, "99%"), (3.0, "99.9%"), (4.0, "99.99%"), (5.0, "99.999%")];
    Chart {
        title: "Latency by percentile",
        x_label: "percentile",
        y_label: "latency (ms)",
        x_max: NINES_MAX,
        x_ticks: x_ticks.into_iter().map(|(at, label)| (at, label.to_string())).collect(),
        points: report.percentiles.iter().map(|&[q, ms]| (nines(q), ms)).collect(),
        bands: Vec::new(),
        marks: Vec::new(),
    }
}

/// The throughput-by-second chart.
fn throughput_chart(report: &LoadReport) -> Chart<'static> {
    let seconds = report.timeline.len().max(1) as f64;
    let x_ticks = nice_ticks(seconds, 10.0);
    // Each second's count drawn across that second.
    let points =
        report.timeline.iter().enumerate().flat_map(|(second, &ops)| [(second as f64, ops as f64), (second as f64 + 1.0, ops as f64)]).collect();
    Chart {
        title: "Throughput over time",
        x_label: "second of the measured window",
        y_label: "operations per second",
        x_max: seconds,
        x_ticks,
        points,
        bands: Vec::new(),
        marks: Vec::new(),
    }
}

/// A two-column table of `rows`.
pub fn table(rows: &[(&'static str, String)]) -> String {
    let mut html = String::from("<table>");
    for (name, value) in rows {
        let _ = write!(html, "<tr><th>{}</th><td>{}</td></tr>", escape(name.trim()), escape(value));
    }
    html.push_str("</table>");
    html
}

/// A page's head (inline style, nothing fetched) and its `<h1>`; the caller closes it with
/// `</body></html>`.
pub fn page_start(title: &str) -> String {
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title><style>\
         body{{font-family:sans-serif;margin:24px;color:#222}} table{{border-collapse:collapse;margin:8px 0 24px}}\
         th,td{{border:1px solid #ccc;padding:4px 10px;text-align:left}} th{{background:#f0f0f0}}\
         figure{{margin:0 0 24px}} figcaption{{font-weight:bold;margin-bottom:4px}}</style></head><body><h1>{title}</h1>",
        title = escape(title)
    )
}

/// The whole page.
pub fn render(report: &LoadReport) -> String {
    let title = format!("warden-loadgen: {} on {}", report.workload, report.target);
    let mut html = page_start(&title);
    let _ = write!(html, "<h2>Parameters</h2>{}<h2>Results</h2>{}", table(&report.parameters()), table(&report.results()));
    html.push_str(&latency_chart(report).svg());
    html.push_str(&throughput_chart(report).svg());
    html.push_str("</body></html>\n");
    html
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{args, measured};

    #[test]
    fn the_page_is_self_contained_with_both_charts_and_the_parameters() {
        let report = LoadReport::new(&args(&["put", "--clients", "100", "--label", "<script>alert(1)</script>"]), &measured(), None, None);
        let page = render(&report);
        assert!(page.starts_with("<!DOCTYPE html>") && page.trim_end().ends_with("</html>"));
        assert_eq!(page.matches("<svg").count(), 2, "latency and throughput charts");
        assert!(page.contains("Latency by percentile") && page.contains("Throughput over time"));
        assert!(page.contains("99.999%"), "the percentile axis reaches five nines");
        assert!(page.contains("<th>clients</th><td>100</td>"));
        // Nothing fetched from the network, and user text cannot inject markup.
        assert!(!page.contains("<script"), "the label was not escaped");
        assert!(page.contains("&lt;script&gt;"));
        for fetch in ["src=", "href=", "@import", "url("] {
            assert!(!page.contains(fetch), "the page loads something: {fetch}");
        }
    }

    #[test]
    fn chart_points_stay_inside_the_plot() {
        let report = LoadReport::new(&args(&["get"]), &measured(), None, None);
        for chart in [latency_chart(&report), throughput_chart(&report)] {
            let svg = chart.svg();
            let points = svg.split("points=\"").nth(1).and_then(|rest| rest.split('"').next()).expect("a polyline");
            for point in points.split(' ') {
                let (x, y) = point.split_once(',').expect("x,y");
                let (x, y): (f64, f64) = (x.parse().expect("a number"), y.parse().expect("a number"));
                assert!((MARGIN - 0.1..=MARGIN + PLOT_WIDTH + 0.1).contains(&x), "x {x} outside in {}", chart.title);
                assert!((MARGIN / 2.0 - 0.1..=MARGIN / 2.0 + PLOT_HEIGHT + 0.1).contains(&y), "y {y} outside in {}", chart.title);
            }
        }
    }

    #[test]
    fn axis_tops_are_nice_numbers_at_least_the_data() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(3.2), 5.0);
        assert_eq!(nice_ceiling(99.0), 100.0);
        assert_eq!(nice_ceiling(101.0), 200.0);
        assert!((nines(0.99) - 2.0).abs() < 1e-9);
        assert_eq!(nines(1.0), NINES_MAX);
    }
}

//! The bench's charts, drawn with `plotters` into SVG: panels side by side
//! over one categorical x axis (a sweep's values, or a run's processes),
//! each panel lines or grouped bars, one per series, with a legend.

use std::path::Path;

use plotters::prelude::*;

/// A figure of panels.
pub(super) struct Chart {
    pub(super) title: String,
    pub(super) panels: Vec<Panel>,
}

/// One panel: its series over labelled categories, as lines, or as bars
/// grouped by category.
pub(super) struct Panel {
    pub(super) title: String,
    pub(super) x_axis: String,
    /// One label per category, in order: every series has one value each.
    pub(super) x_labels: Vec<String>,
    pub(super) bars: bool,
    pub(super) series: Vec<Series>,
}

/// A named value per category.
pub(super) struct Series {
    pub(super) name: String,
    pub(super) values: Vec<f64>,
}

/// Panels per row of a figure.
const COLUMNS: usize = 2;
/// The size of one panel, in pixels.
const PANEL: (u32, u32) = (640, 420);

impl Chart {
    /// Draws the chart into an SVG file at `path`.
    pub(super) fn render(&self, path: &Path) -> anyhow::Result<()> {
        let columns = self.panels.len().clamp(1, COLUMNS);
        let rows = self.panels.len().div_ceil(columns).max(1);
        let size = (PANEL.0 * columns as u32, PANEL.1 * rows as u32 + 40);
        let root = SVGBackend::new(path, size).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(&self.title, ("sans-serif", 22))?;
        for (area, panel) in root.split_evenly((rows, columns)).iter().zip(&self.panels) {
            panel.draw(area)?;
        }
        root.present()?;
        Ok(())
    }
}

impl Panel {
    /// The panel into its area.
    fn draw(
        &self,
        area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    ) -> anyhow::Result<()> {
        let categories = self.x_labels.len();
        let highest = self
            .series
            .iter()
            .flat_map(|s| s.values.iter().copied())
            .filter(|v| v.is_finite())
            .fold(0.0_f64, f64::max);
        // Room above the highest value for the legend.
        let top = if highest > 0.0 { highest * 1.35 } else { 1.0 };
        let mut chart = ChartBuilder::on(area)
            .caption(&self.title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(42)
            .y_label_area_size(56)
            .build_cartesian_2d(-0.5..categories as f64 - 0.5, 0.0..top)?;
        // Categories sit on whole numbers; the mesh labels only those.
        let label = |x: &f64| {
            let nearest = x.round();
            match ((x - nearest).abs() < 1e-6, usize::try_from(nearest as i64)) {
                (true, Ok(i)) => self.x_labels.get(i).cloned().unwrap_or_default(),
                _ => String::new(),
            }
        };
        chart
            .configure_mesh()
            .x_labels(categories.max(1))
            .x_label_formatter(&label)
            .x_desc(&self.x_axis)
            .disable_x_mesh()
            .light_line_style(WHITE)
            .draw()?;
        let count = self.series.len().max(1);
        for (n, series) in self.series.iter().enumerate() {
            let color = Palette99::pick(n).to_rgba();
            let at = (series.values.iter().enumerate())
                .filter(|(_, v)| v.is_finite())
                .map(|(i, v)| (i as f64, *v));
            if self.bars {
                // Side by side within 80% of a category's width.
                let width = 0.8 / count as f64;
                let left = -0.4 + width * n as f64;
                chart.draw_series(at.map(|(x, v)| {
                    Rectangle::new([(x + left, 0.0), (x + left + width, v)], color.filled())
                }))?
            } else {
                chart.draw_series(at.clone().map(|p| Circle::new(p, 3, color.filled())))?;
                chart.draw_series(LineSeries::new(at, color.stroke_width(2)))?
            }
            .label(series.name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 4), (x + 14, y + 4)], color.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 12))
            .draw()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_is_an_svg_with_its_labels_and_legend() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("chart.svg");
        let chart = Chart {
            title: "a sweep".to_owned(),
            panels: vec![
                Panel {
                    title: "CPU".to_owned(),
                    x_axis: "rounds".to_owned(),
                    x_labels: vec!["1".to_owned(), "10".to_owned(), "50".to_owned()],
                    bars: false,
                    series: vec![Series {
                        name: "orchestrator".to_owned(),
                        values: vec![0.2, 0.15, 0.15],
                    }],
                },
                Panel {
                    title: "floor".to_owned(),
                    x_axis: String::new(),
                    x_labels: vec!["p50".to_owned(), "p99".to_owned()],
                    bars: true,
                    series: vec![Series {
                        name: "raw JetStream".to_owned(),
                        values: vec![0.02, f64::NAN],
                    }],
                },
            ],
        };
        chart.render(&path).expect("drawn");
        let svg = std::fs::read_to_string(&path).expect("written");
        assert!(svg.starts_with("<svg"), "{svg:.80}");
        // Each `<text ...>` element's content, on lines of its own.
        let texts: Vec<&str> = (svg.split("<text").skip(1))
            .filter_map(|element| element.split_once('>')?.1.split_once("</text>"))
            .map(|(content, _)| content.trim())
            .collect();
        for text in [
            "a sweep",
            "rounds",
            "p99",
            "50",
            "orchestrator",
            "raw JetStream",
            "CPU",
        ] {
            assert!(texts.contains(&text), "no {text:?} in {texts:?}");
        }
        // Labels only where a category is.
        assert!(!texts.contains(&"0.5"), "{texts:?}");
    }
}

//! A metric of one cell across runs as an inline SVG line chart, drawn with `plotters`' SVG
//! backend: x is the run's position in the report (1 = oldest), y the metric's value; runs
//! without the metric leave a gap in the line. It draws numbers only; the metric's name is
//! the page's caption, not part of the SVG.

use plotters::prelude::*;

/// The SVG of `values` (one per run, `None` where the run has no value), or `None` when no
/// run has one.
pub fn metric_svg(values: &[Option<f64>], steps: &[usize]) -> Option<String> {
    let finite: Vec<f64> = values
        .iter()
        .flatten()
        .copied()
        .filter(|v| v.is_finite())
        .collect();
    if finite.is_empty() {
        return None;
    }
    let lo = finite.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    // A range past f64 (from -1e308 to 1e308) cannot be drawn: no plot rather than a
    // drawing that never ends.
    if !(hi - lo).is_finite() || !(hi.abs() * 1.2).is_finite() || !(lo.abs() * 1.2).is_finite() {
        return None;
    }
    // A constant metric still gets a visible band around its value.
    // A constant metric gets a band of 10 % around its value (0.001 is drawn at 0.001 on
    // an axis of its own scale, not as a dot on zero), or ±0.1 around zero.
    let pad = if hi > lo {
        (hi - lo) * 0.1
    } else if lo == 0.0 {
        0.1
    } else {
        lo.abs().max(1e-300) * 0.1
    };
    let mut svg = String::new();
    draw(&mut svg, values, steps, (lo - pad, hi + pad)).ok()?;
    Some(svg)
}

fn draw(
    svg: &mut String,
    values: &[Option<f64>],
    steps: &[usize],
    (lo, hi): (f64, f64),
) -> Result<(), Box<dyn std::error::Error>> {
    let runs = values.len();
    let root = SVGBackend::with_string(svg, (640, 220)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .margin(10)
        .x_label_area_size(28)
        .y_label_area_size(70)
        .build_cartesian_2d(0.5f64..runs as f64 + 0.5, lo..hi)?;
    chart
        .configure_mesh()
        // The labelled grid lines only: the light lines between them weighed four fifths
        // of a cell page (a thousand cell pages a report).
        .max_light_lines(0)
        .x_labels(runs.min(12))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_labels(5)
        .y_label_formatter(&|y| format!("{y:.3e}"))
        .x_desc("run")
        .draw()?;
    let blue = RGBColor(31, 94, 168);
    // A change point: a red line between the last run of the old level and the first of
    // the new.
    let red = RGBColor(200, 30, 30);
    for &at in steps {
        let x = at as f64 + 0.5;
        chart.draw_series(LineSeries::new([(x, lo), (x, hi)], red.stroke_width(2)))?;
    }
    // One line per stretch of consecutive runs that have the metric.
    let mut stretch: Vec<(f64, f64)> = Vec::new();
    let mut points: Vec<(f64, f64)> = Vec::new();
    for (i, v) in values.iter().enumerate() {
        match v.filter(|v| v.is_finite()) {
            Some(v) => {
                stretch.push((i as f64 + 1.0, v));
                points.push((i as f64 + 1.0, v));
            }
            None if !stretch.is_empty() => {
                chart.draw_series(LineSeries::new(std::mem::take(&mut stretch), &blue))?;
            }
            None => {}
        }
    }
    if !stretch.is_empty() {
        chart.draw_series(LineSeries::new(stretch, &blue))?;
    }
    chart.draw_series(points.into_iter().map(|p| Circle::new(p, 3, blue.filled())))?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_becomes_an_svg_with_a_point_per_value() {
        let svg = metric_svg(&[Some(1.0), None, Some(3.0), Some(2.0)], &[]).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        assert_eq!(svg.matches("<circle").count(), 3, "{svg}");
        // The gap splits the line in two.
        let lines = svg
            .lines()
            .filter(|l| l.starts_with("<polyline") && l.contains("#1F5EA8"))
            .count();
        assert_eq!(lines, 2, "{svg}");
        assert!(metric_svg(&[None, None], &[]).is_none());
        assert!(metric_svg(&[Some(-1e308), Some(1e308)], &[]).is_none());
        assert!(metric_svg(&[Some(0.0), Some(f64::MAX)], &[]).is_none());
        assert!(metric_svg(&[Some(5.0)], &[]).is_some());
        // A step is a red line, one per step.
        let svg = metric_svg(&[Some(1.0), Some(1.0), Some(2.0)], &[2]).unwrap();
        let red = svg
            .lines()
            .filter(|l| l.starts_with("<polyline") && l.contains("#C81E1E"))
            .count();
        assert_eq!(red, 1, "{svg}");
    }
}

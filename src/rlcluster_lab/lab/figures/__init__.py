"""The lab's figures, each a pure function of report JSON and defined once: the report's in SVG
(placement, memory, sync), shown by the notebooks and the widget alike; the notebooks' charts in
matplotlib (step, plan, shard); the decision flow as rows, and the style every figure shares."""

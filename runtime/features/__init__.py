"""Features learned once: the transforms from a table's raw fields to the model's ids and floats.

Design note (the API the readers, `predict`, `retrieve`, eval and the server share)
----------------------------------------------------------------------------------
A transform is a pure, versioned pair, registered by the spec's kind
(runtime.features.registry):

    fit(config, raw column) -> partial      one pass over the training rows, in chunks;
    merge(config, partials) -> partial      partials of files / processes add up (counts, sums)
    finish(config, partial) -> state        plain JSON data, stored in features.json
    without_values(config, partial)         (vocabulary, quantiles, numeric) what was learned from no
        -> str | None                       value at all: learning warns of it (a constant input)
    apply(config, state, raw column) -> ids or floats

Kinds (the spec's keys): sparse `vocabulary` (min_count, max_size, one OOV row
or `oov_buckets: N` hashed), `hash` (no state: today's behaviour), `cross`
(several columns hashed together), `quantiles` (learned equal-frequency
buckets of a dense column), `history` (the earlier items of a key in the same
event table); dense `numeric` (fill, clip, log, standardize / min_max) and
`aggregate` (a dense `history`: the mean of a column, or the count, of the
earlier training rows of a key, runtime.features.aggregate).
The configs are runtime.config.transforms's frozen dataclasses, carried by the
generated module's INPUTS (SparseFeatureConfig.transform,
DenseFeatureConfig.transform).

The learned state of a model is one `LearnedFeatures` (runtime.features.state):
written as `features.json` beside prepared data (with its sha256 in the
manifest), beside the generated module while training (`<module>.features.json`),
inside every checkpoint and every export. It reaches the readers as
`ModelInputs.learned` (`dataclasses.replace(inputs, learned=state)`).

Where raw fields become model inputs (the one path, for every caller):

    runtime.data.tables.mapping.parse_row(layout, {column: raw field})   # one row, raw values kept
    runtime.data.tables.mapping.to_columns(layout, rows)                 # apply(): ids and floats
    runtime.data.feature_columns.to_features(columns, inputs)            # fan-out, fixed buckets

`inputs_with_learned = runtime.data.tables.learn.with_learned(module.INPUTS, export_dir / "features.json")`
(an export's manifest lists the file under "features"), then
`layout = table_layout(inputs_with_learned, "csv")`; CsvReader, ParquetReader,
`predict`, `retrieve`, `train --eval-data` and a server all go through these
three calls, so the same raw row gives the same ids and numbers on every path.
Learning (`learn_features`, runtime.data.tables.learn) is one pass over the
training files' rows before the first step (runtime.train.feature_state: on
rank 0, its bytes broadcast to every rank) or in `data prepare`. Nothing
relearns silently: a reader whose spec has learned transforms and no state is
a DataError.
"""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(
    globals(),
    {
        "registry": ("transform",),
        "state": ("FeatureStateError", "Learned", "LearnedFeatures", "read_features"),
    },
)

"""The stages of one render (DESIGN section 4), each a module with its own inputs and outputs,
in the order `pipeline.render` calls them: load, propose, eligible, apply (timing, then apply),
budget, show (repair, render, count), record; the draft is the view they work on."""

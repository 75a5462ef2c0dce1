"""Reference pipelines that ship with ardiff (registered in the `ardiff.pipelines` group)."""

"""Streaming video output. `writer.VideoWriter` is the entry point; `formats.FORMATS` lists the
output formats (the one table to extend), `codecs` checks an output's settings against it,
`encoders` writes frames, `disk` owns work files and publishing, `pixels` upscales."""

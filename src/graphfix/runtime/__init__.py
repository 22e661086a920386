"""Below everything that runs a model: sessions, feeds, the verdict, reference forms."""

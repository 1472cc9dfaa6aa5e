"""Operations: what the router tells its operators (metrics)."""

"""The `stream_k` variant: the MAC-loop iterations of all output tiles split
evenly over persistent workers, partial tiles fixed up afterwards."""

"""Streamlit entry point (placeholder until the app issue lands)."""

import streamlit as st

st.title("Attention Alignment Explorer")
st.write("The app is under construction; use `python -m core --help` meanwhile.")

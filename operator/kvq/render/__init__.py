"""kvq.render"""
